"""psycopg 3 and asyncpg at their defaults making the statement-name mistakes of
tests/weir_made_errors.rs (a name taken, names like Weir's own, DEALLOCATE of what the
server lacks) and failing statements, in and out of transactions. Run once directly and
once through Weir; tests/weir_made_errors.rs compares what each client printed (the
SQLSTATE of every error it got, in order) and what PostgreSQL logged for it. Each
client's application_name is WEIR_APP_PREFIX plus its number."""
import asyncio
import os
import threading

import asyncpg
import psycopg

from common import CLIENTS, DB, HOST, PORT, USER

PREFIX = os.environ["WEIR_APP_PREFIX"]


def psycopg_client(i, seen):
    # Defaults: not autocommit (every statement opens a block), statements prepared
    # after five executions (_pg3_<n>).
    conn = psycopg.connect(host=HOST, port=PORT, dbname=DB, user=USER,
                           application_name=f"{PREFIX}psycopg{i}")

    def attempt(sql, params=None):
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                if cur.description:
                    seen.append(repr(cur.fetchall()))
            conn.commit()
        except psycopg.Error as e:
            seen.append(e.sqlstate)
            conn.rollback()

    for n in range(8):
        attempt("select %s::int + 1 as n", (n,))
    attempt("prepare pq as select 'pq'")
    attempt("prepare pq as select 'again'")
    for name in ["weir_1", "weir_2", "weir_3"]:
        attempt(f"execute {name}")
        attempt(f"deallocate {name}")
    attempt("select 1/0")
    for n in range(8):
        attempt("select %s::int + 1 as n", (n,))
    attempt("execute pq")
    attempt("deallocate pq")
    attempt("deallocate pq")
    conn.close()


async def asyncpg_client(i, seen):
    # Defaults: every query a named statement (__asyncpg_stmt_<n>__), autocommit outside
    # transaction().
    conn = await asyncpg.connect(host=HOST, port=PORT, database=DB, user=USER,
                                 server_settings={"application_name": f"{PREFIX}asyncpg{i}"})

    async def run(sql, args):
        # Without arguments a simple query (SQL PREPARE, EXECUTE and DEALLOCATE are
        # followed only there); with them, a named statement.
        if args:
            return repr(await conn.fetch(sql, *args))
        return await conn.execute(sql)

    async def attempt(sql, *args, block=False):
        try:
            if block:
                async with conn.transaction():
                    seen.append(await run(sql, args))
            else:
                seen.append(await run(sql, args))
        except asyncpg.PostgresError as e:
            seen.append(e.sqlstate)

    for n in range(4):
        await attempt("select $1::int + 1 as n", n)
    await attempt("prepare aq as select 'aq'")
    for block in [True, False]:
        await attempt("prepare aq as select 'again'", block=block)
        for name in ["weir_1", "weir_2", "weir_4"]:
            await attempt(f"execute {name}", block=block)
            await attempt(f"deallocate {name}", block=block)
        await attempt("select 1/0", block=block)
        await attempt("select $1::int + 1 as n", 5, block=block)
    await attempt("execute aq")
    await attempt("deallocate aq")
    await conn.close()


def main():
    results = {}

    def run_psycopg(i):
        seen = results.setdefault(f"psycopg{i}", [])
        psycopg_client(i, seen)

    threads = [threading.Thread(target=run_psycopg, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()

    async def run_asyncpg():
        await asyncio.gather(*(asyncpg_client(i, results.setdefault(f"asyncpg{i}", []))
                               for i in range(CLIENTS)))

    asyncio.run(run_asyncpg())
    for t in threads:
        t.join()
    for name in sorted(results):
        print(name, " ".join(results[name]))


main()
