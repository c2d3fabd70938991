"""asyncpg through Weir with its default settings (statement cache on).

WEIR_URL names the pooler; ten connections run at once.
"""
import asyncio
import os

import asyncpg

URL = os.environ["WEIR_URL"]


async def client(n):
    conn = await asyncpg.connect(URL)
    try:
        for i in range(8):  # the same text each time: served from the cache
            assert await conn.fetchval("SELECT $1::int + $2::int", n, i) == n + i
        async with conn.transaction():
            await conn.execute("CREATE TEMP TABLE t (a int, b text) ON COMMIT DROP")
            await conn.executemany("INSERT INTO t VALUES ($1, $2)", [(i, str(i)) for i in range(20)])
            await conn.copy_records_to_table("t", records=[(100 + i, "c") for i in range(10)])
            assert await conn.fetchval("SELECT count(*) FROM t") == 30
        try:
            async with conn.transaction():
                await conn.execute("SELECT 1/0")
            raise AssertionError("division by zero did not fail")
        except asyncpg.exceptions.DivisionByZeroError:
            pass
        assert await conn.fetchval("SELECT 42") == 42
    finally:
        await conn.close()


async def set_isolation():
    a = await asyncpg.connect(URL)
    b = await asyncpg.connect(URL)
    try:
        await a.execute("SET search_path = pg_catalog; SET application_name = 'client-a'")
        for _ in range(5):
            sp = await b.fetchval("SHOW search_path")
            assert sp == '"$user", public', f"client B sees search_path {sp!r}"
            assert await b.fetchval("SHOW application_name") != "client-a"
    finally:
        await a.close()
        await b.close()


async def main():
    await asyncio.gather(*(client(n) for n in range(10)))
    await set_isolation()
    print("asyncpg: ok")


asyncio.run(main())
