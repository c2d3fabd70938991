"""psycopg 3 at its default settings (prepare_threshold=5) through Weir in transaction mode."""
import threading

import psycopg

from common import CLIENTS, DB, HOST, PORT, USER, check, run_clients

barrier = threading.Barrier(CLIENTS)


def client(i):
    app = f"drv-psycopg-{i}"
    with psycopg.connect(host=HOST, port=PORT, dbname=DB, user=USER, application_name=app) as conn:
        conn.autocommit = True
        # The same query more than prepare_threshold times: psycopg prepares it (_pg3_N).
        for n in range(8):
            row = conn.execute("select %s::int + %s::int, current_setting('application_name')", (n, i)).fetchone()
            check(row[0] == n + i, f"client {i}: {row[0]} != {n + i}")
            # application_name is a startup parameter: it stays this client's whichever
            # server the transaction ran on.
            check(row[1] == app, f"client {i}: application_name {row[1]!r} != {app!r}")
            if n == 3:
                barrier.wait()
        check(
            conn.execute("select count(*) from pg_prepared_statements").fetchone() is not None,
            "pg_prepared_statements",
        )

        # A transaction with an error mid-way: rolled back, and the connection still works.
        try:
            with conn.transaction():
                conn.execute("insert into drv_psycopg (id, v) values (%s, 'lost')", (100000 + i,))
                conn.execute("select 1 / (%s::int - %s::int)", (i, i))
            check(False, "division by zero was not raised")
        except psycopg.errors.DivisionByZero:
            pass
        row = conn.execute("select count(*) from drv_psycopg where id = %s", (100000 + i,)).fetchone()
        check(row[0] == 0, f"client {i}: the failed transaction's insert is visible")

        # COPY in and out.
        with conn.cursor() as cur:
            with cur.copy("copy drv_psycopg (id, v) from stdin") as copy:
                for k in range(100):
                    copy.write_row((i * 1000 + k, f"c{i}-{k}"))
            out = []
            with cur.copy("copy (select v from drv_psycopg where id / 1000 = %s order by id) to stdout" % i) as copy:
                for row in copy.rows():
                    out.append(row[0])
            check(out == [f"c{i}-{k}" for k in range(100)], f"client {i}: copy out {out[:3]}...")

        # Prepared again after the COPY, and inside an explicit transaction.
        with conn.transaction():
            for n in range(6):
                row = conn.execute("select %s::int + %s::int, current_setting('application_name')", (n, i)).fetchone()
                check(row == (n + i, app), f"client {i}: {row}")

        # Session state (SET search_path) follows the client in transaction mode, and
        # no other client on the same server sees it.
        conn.execute(f"set search_path to drv_schema_{i}, public")
        barrier.wait()
        row = conn.execute("show search_path").fetchone()
        check(row[0] == f"drv_schema_{i}, public", f"client {i}: search_path {row[0]!r}")

        # LISTEN (psycopg sends it with the extended protocol): every client hears the
        # NOTIFY client 0 sends once all listen.
        conn.execute("LISTEN drv_psycopg_all")
        barrier.wait()
        if i == 0:
            conn.execute("NOTIFY drv_psycopg_all, 'hello'")
        got = [n.payload for n in conn.notifies(timeout=20, stop_after=1)]
        check(got == ["hello"], f"client {i}: notifications {got!r}")


run_clients(client, barrier, f"psycopg {psycopg.__version__}")
