"""libpq 18 (psycopg's wheel) asking for protocol 3.2: max_protocol_version=3.2.

A server that speaks 3.0 only (PostgreSQL before 18, Weir) answers with
NegotiateProtocolVersion naming 3.0, and libpq carries on with 3.0; with
min_protocol_version=3.2 libpq must refuse the server instead. Reads WEIR_HOST,
WEIR_PORT, WEIR_DB, WEIR_USER.
"""
import os

import psycopg

BASE = " ".join(
    f"{k}={os.environ['WEIR_' + k.upper()]}" for k in ("host", "port", "user")
) + f" dbname={os.environ['WEIR_DB']}"

assert psycopg.pq.version() >= 180000, f"libpq {psycopg.pq.version()} predates 3.2"

with psycopg.connect(BASE + " max_protocol_version=3.2", autocommit=True) as conn:
    got = conn.execute("SELECT 'answered over ' || %s", ("3.0",)).fetchone()[0]
    assert got == "answered over 3.0", got
    assert conn.pgconn.protocol_version == 3, conn.pgconn.protocol_version
    assert conn.info.full_protocol_version == 30000, conn.info.full_protocol_version

try:
    psycopg.connect(BASE + " min_protocol_version=3.2").close()
    raise AssertionError("min_protocol_version=3.2 accepted a 3.0 server")
except psycopg.OperationalError as e:
    refusal = str(e)
    assert "3.2" in refusal, refusal

print("negotiated 3.0; min 3.2 refused:", refusal.strip().splitlines()[-1])
