"""psycopg 3 through Weir after DDL changes what a prepared statement returns (issue 11).

With autocommit, psycopg runs a prepared statement with libpq's Bind, Describe,
Execute, Sync, each in an implicit transaction: Weir runs it again on a fresh
statement, and the cursor sees the new columns (PostgreSQL directly refuses the
stale plan). In a transaction block the refusal comes through, as directly.
Reads WEIR_URL (the pooler) and PG_URL (PostgreSQL, for the DDL); exits 0 when
every check passed.
"""

import os

import psycopg

SQL = "select * from rt"


def columns(cur):
    return [d.name for d in cur.description]


with psycopg.connect(os.environ["PG_URL"], autocommit=True) as ddl, psycopg.connect(
    os.environ["WEIR_URL"], autocommit=True
) as c:
    cur = c.execute(SQL, prepare=True)
    assert (columns(cur), cur.fetchall()) == (["a"], [(1,)]), cur.description
    ddl.execute("alter table rt add column b int default 7")
    for _ in range(3):
        cur = c.execute(SQL, prepare=True)
        assert (columns(cur), cur.fetchall()) == (["a", "b"], [(1, 7)])
    ddl.execute("alter table rt add column c int default 8")
    try:
        with c.transaction():
            c.execute(SQL, prepare=True)
        raise AssertionError("no refusal in a transaction block")
    except psycopg.errors.FeatureNotSupported as e:
        assert "cached plan must not change result type" in str(e), e
    cur = c.execute(SQL, prepare=True)
    assert (columns(cur), cur.fetchall()) == (["a", "b", "c"], [(1, 7, 8)])
print("ok")
