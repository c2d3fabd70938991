"""psycopg 3 through Weir with its default settings (prepare_threshold=5).

WEIR_URL names the pooler. Ten threads share a pool of two server
connections; each runs the same parametrised query past the prepare
threshold, so psycopg switches to named prepared statements.
"""
import os
import threading

import psycopg

URL = os.environ["WEIR_URL"]
CLIENTS = 10
errors = []


def prepared_past_threshold(n):
    with psycopg.connect(URL, autocommit=True) as conn:
        for i in range(8):
            got = conn.execute("SELECT %s::int + %s::int", (n, i)).fetchone()[0]
            assert got == n + i, (got, n, i)
        # Pipeline mode: several extended-protocol queries before one Sync.
        with conn.pipeline():
            curs = [conn.execute("SELECT %s::int * 2", (k,)) for k in range(5)]
        assert [c.fetchone()[0] for c in curs] == [0, 2, 4, 6, 8]


def worker(n):
    try:
        prepared_past_threshold(n)
    except Exception as e:  # reported by the main thread
        errors.append(f"client {n}: {type(e).__name__}: {e}")


def error_mid_transaction():
    with psycopg.connect(URL) as conn:
        try:
            with conn.transaction():
                conn.execute("SELECT 1/0")
            raise AssertionError("division by zero did not fail")
        except psycopg.errors.DivisionByZero:
            pass
        assert conn.execute("SELECT 42").fetchone()[0] == 42
        conn.commit()


def copy_in_and_out():
    with psycopg.connect(URL) as conn:
        conn.execute("CREATE TEMP TABLE t (a int, b text)")
        with conn.cursor().copy("COPY t FROM STDIN") as copy:
            for i in range(100):
                copy.write_row((i, f"row {i}"))
        out = []
        with conn.cursor().copy("COPY (SELECT a FROM t ORDER BY a) TO STDOUT") as copy:
            for row in copy.rows():
                out.append(int(row[0]))
        assert out == list(range(100)), out[:5]
        conn.rollback()


def set_isolation():
    with psycopg.connect(URL, autocommit=True) as a, psycopg.connect(URL, autocommit=True) as b:
        a.execute("SET search_path = pg_catalog")
        a.execute("SET application_name = 'client-a'")
        for _ in range(5):
            sp = b.execute("SHOW search_path").fetchone()[0]
            app = b.execute("SHOW application_name").fetchone()[0]
            assert sp == '"$user", public', f"client B sees search_path {sp!r}"
            assert app != "client-a", "client B sees client A's application_name"
        assert a.execute("SHOW search_path").fetchone()[0] == "pg_catalog"


threads = [threading.Thread(target=worker, args=(n,)) for n in range(CLIENTS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, "\n".join(errors)
error_mid_transaction()
copy_in_and_out()
set_isolation()
print("psycopg: ok")
