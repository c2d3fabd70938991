"""asyncpg at its default settings (statement cache of 100 named statements) through
Weir in transaction mode."""
import asyncio
import sys

import asyncpg

from common import CLIENTS, DB, HOST, PORT, USER, check


async def client(i, barrier):
    app = f"drv-asyncpg-{i}"
    conn = await asyncpg.connect(host=HOST, port=PORT, database=DB, user=USER,
                                 server_settings={"application_name": app})
    try:
        # Every query goes through asyncpg's statement cache (__asyncpg_stmt_N__), reused here.
        for n in range(8):
            row = await conn.fetchrow("select $1::int + $2::int as s, current_setting('application_name') as a", n, i)
            check(row["s"] == n + i, f"client {i}: {row['s']} != {n + i}")
            check(row["a"] == app, f"client {i}: application_name {row['a']!r} != {app!r}")
            if n == 3:
                await barrier.wait()
        stmt = await conn.prepare("select $1::text || $2::text")
        for n in range(6):
            check(await stmt.fetchval(str(i), str(n)) == f"{i}{n}", "explicit prepare")

        await conn.executemany("insert into drv_asyncpg (id, v) values ($1, $2)",
                               [(i * 1000 + k, f"m{i}-{k}") for k in range(50)])
        check(await conn.fetchval("select count(*) from drv_asyncpg where id / 1000 = $1", i) == 50,
              f"client {i}: executemany")

        try:
            async with conn.transaction():
                await conn.execute("insert into drv_asyncpg (id, v) values ($1, 'lost')", i * 1000 + 999)
                await conn.fetchval("select 1 / ($1::int - $1::int)", i)
            check(False, "division by zero was not raised")
        except asyncpg.exceptions.DivisionByZeroError:
            pass
        check(await conn.fetchval("select count(*) from drv_asyncpg where id = $1", i * 1000 + 999) == 0,
              f"client {i}: the failed transaction's insert is visible")

        async with conn.transaction():
            await conn.execute("insert into drv_asyncpg (id, v) values ($1, 'tx')", i * 1000 + 998)
            check(await conn.fetchval("select v from drv_asyncpg where id = $1", i * 1000 + 998) == "tx", "in tx")

        await conn.copy_records_to_table("drv_asyncpg", records=[(i * 1000 + 500 + k, f"c{i}-{k}") for k in range(100)],
                                         columns=["id", "v"])
        got = await conn.fetch("select v from drv_asyncpg where id / 1000 = $1 and id % 1000 >= 500 and id % 1000 < 600 order by id", i)
        check([r["v"] for r in got] == [f"c{i}-{k}" for k in range(100)], f"client {i}: copy_records_to_table")

        # Session state (SET search_path) follows the client in transaction mode, and
        # no other client on the same server sees it.
        await conn.execute(f"set search_path to drv_schema_{i}, public")
        await barrier.wait()
        check(await conn.fetchval("show search_path") == f"drv_schema_{i}, public", "search_path")
    finally:
        await conn.close()


async def pooled(check_app):
    """asyncpg's own pool: its release resets the connection (RESET ALL, CLOSE ALL, ...).
    With check_app, also that application_name is still the startup value after RESET ALL."""
    pool = await asyncpg.create_pool(host=HOST, port=PORT, database=DB, user=USER, min_size=2, max_size=4,
                                     server_settings={"application_name": "drv-asyncpg-pool"})
    try:
        # The ignored test runs this directly, then through Weir, on one database.
        await pool.execute("delete from drv_asyncpg where id >= 200000")

        async def use(k):
            async with pool.acquire() as c:
                row = await c.fetchrow("select $1::int * 2 as d, current_setting('application_name') as a", k)
                check(row["d"] == 2 * k, f"pool: {row}")
                check(not check_app or row["a"] == "drv-asyncpg-pool", f"pool: application_name after RESET ALL: {row}")
                async with c.transaction():
                    await c.execute("insert into drv_asyncpg (id, v) values ($1, 'pool')", 200000 + k)
        await asyncio.gather(*(use(k) for k in range(40)))
        check(await pool.fetchval("select count(*) from drv_asyncpg where id >= 200000") == 40, "pool inserts")
    finally:
        await pool.close()


async def clients():
    barrier = asyncio.Barrier(CLIENTS)
    results = await asyncio.gather(*(client(i, barrier) for i in range(CLIENTS)), return_exceptions=True)
    failed = [f"client {i}: {type(r).__name__}: {r}" for i, r in enumerate(results) if isinstance(r, BaseException)]
    for f in failed:
        print(f)
    check(not failed, f"{len(failed)} client(s) failed")
    print(f"asyncpg {asyncpg.__version__}: {CLIENTS} clients ok")


async def pool():
    await pooled(check_app=False)
    print(f"asyncpg {asyncpg.__version__}: pool ok")


async def pool_app():
    await pooled(check_app=True)
    print(f"asyncpg {asyncpg.__version__}: pool and application_name ok")


# "clients" (the default), "pool" or "pool-app".
programs = {"clients": clients, "pool": pool, "pool-app": pool_app}
asyncio.run(programs[sys.argv[1] if len(sys.argv) > 1 else "clients"]())
