"""libpq 18 (psycopg's wheel) asking for protocol 3.2: max_protocol_version=3.2.

Usage: protocol_3_2.py 3.0|3.2, the version the server is expected to give. A server
that speaks 3.0 only (PostgreSQL before 18) answers with NegotiateProtocolVersion naming
3.0, and libpq carries on with 3.0; with min_protocol_version=3.2 libpq must then refuse
the server. One that speaks 3.2 (PostgreSQL 18, Weir) gives it, with a longer cancel
key. Either way, and with a plain 3.0 connection too, cancel_safe() cancels a running
pg_sleep: the query fails with 57014 and leaves pg_stat_activity. Reads WEIR_HOST,
WEIR_PORT, WEIR_DB, WEIR_USER.
"""
import os
import sys
import threading
import time

import psycopg

EXPECTED = {"3.0": 30000, "3.2": 30002}[sys.argv[1]]
BASE = " ".join(
    f"{k}={os.environ['WEIR_' + k.upper()]}" for k in ("host", "port", "user")
) + f" dbname={os.environ['WEIR_DB']}"
SLEEP = "select pg_sleep(30), 'protocol 3.2 check'"

assert psycopg.pq.version() >= 180000, f"libpq {psycopg.pq.version()} predates 3.2"


def sleeping(watcher):
    return watcher.execute(
        "select count(*) from pg_stat_activity where query = %s and state = 'active'",
        (SLEEP,),
    ).fetchone()[0]


def cancel_check(conn, watcher):
    """Runs the sleep in a thread, cancels it once it runs, and checks it is gone."""
    outcome = {}

    def run():
        try:
            conn.execute(SLEEP)
            outcome["error"] = None
        except psycopg.Error as e:
            outcome["error"] = e

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 10
    while sleeping(watcher) == 0:
        assert time.monotonic() < deadline, "the sleep never ran"
        time.sleep(0.05)
    conn.cancel_safe(timeout=10)
    t.join(20)
    assert not t.is_alive(), "the cancelled query did not end"
    err = outcome["error"]
    assert isinstance(err, psycopg.errors.QueryCanceled), repr(err)
    assert err.sqlstate == "57014", err.sqlstate
    deadline = time.monotonic() + 10
    while sleeping(watcher) != 0:
        assert time.monotonic() < deadline, "the cancelled sleep still runs"
        time.sleep(0.05)
    assert conn.execute("select 'after'").fetchone()[0] == "after"


with psycopg.connect(BASE, autocommit=True) as watcher:
    with psycopg.connect(BASE + " max_protocol_version=3.2", autocommit=True) as conn:
        got = conn.execute("SELECT 'answered over ' || %s", (sys.argv[1],)).fetchone()[0]
        assert got == f"answered over {sys.argv[1]}", got
        assert conn.pgconn.protocol_version == 3, conn.pgconn.protocol_version
        assert conn.info.full_protocol_version == EXPECTED, conn.info.full_protocol_version
        cancel_check(conn, watcher)
    with psycopg.connect(BASE, autocommit=True) as conn:
        assert conn.info.full_protocol_version == 30000, conn.info.full_protocol_version
        cancel_check(conn, watcher)

try:
    psycopg.connect(BASE + " min_protocol_version=3.2").close()
    if EXPECTED != 30002:
        raise AssertionError("min_protocol_version=3.2 accepted a 3.0 server")
    refusal = "min 3.2 accepted"
except psycopg.OperationalError as e:
    if EXPECTED == 30002:
        raise
    refusal = str(e)
    assert "3.2" in refusal, refusal
    refusal = "min 3.2 refused: " + refusal.strip().splitlines()[-1]

print(f"negotiated {sys.argv[1]}, cancels work;", refusal)
