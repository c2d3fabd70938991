"""asyncpg (its defaults: every query a cached named statement) meets a column whose type
changed after it prepared a query: directly, PostgreSQL refuses the old statement ("cached
plan must not change result type"; asyncpg raises InvalidCachedStatementError in a
transaction, and outside one prepares again by itself), and the client never reads rows
of the new type with the old description.

Through a pooler the client's next run may land on a server that never held its
statement. The program arranges that: the client prepares on one server (its pid read in
the same transaction), the column changes, another client holds that server in a
transaction, and the client runs its statement again, in a transaction and then outside
one. Each attempt uses its own table; an attempt where the holder got the other server
proves nothing and is made again. With the argument "direct" (a control run against
PostgreSQL itself) every attempt counts.
"""
import asyncio
import sys

import asyncpg

from common import DB, HOST, PORT, USER, check

KW = dict(host=HOST, port=PORT, database=DB, user=USER)
DIRECT = sys.argv[1:] == ["direct"]


async def attempt(n):
    table = f"stale_{sys.argv[1]}_{n}"
    setup = await asyncpg.connect(**KW)
    await setup.execute(f"create table {table} (id int primary key, v int)")
    await setup.execute(f"insert into {table} values (1, 41)")
    await setup.close()
    query = f"select v from {table} where id = $1"

    client = await asyncpg.connect(**KW)
    holder = await asyncpg.connect(**KW)
    try:
        async with client.transaction():
            client_pid = await client.fetchval("select pg_backend_pid()")
            check(await client.fetchval(query, 1) == 41, "before the DDL")
        ddl = await asyncpg.connect(**KW)
        await ddl.execute(f"alter table {table} alter column v type text using 'abcd'")
        await ddl.close()

        hold = holder.transaction()
        await hold.start()
        try:
            if await holder.fetchval("select pg_backend_pid()") != client_pid and not DIRECT:
                return False
            try:
                async with client.transaction():
                    got = await client.fetchval(query, 1)
                    check(False, f"in a transaction: read {got!r} with the statement prepared before the DDL")
            except asyncpg.exceptions.InvalidCachedStatementError:
                pass
            got = await client.fetchval(query, 1)
            check(got == "abcd", f"outside a transaction: {got!r}")
            return True
        finally:
            await hold.rollback()
    finally:
        await client.close()
        await holder.close()


async def main():
    for n in range(10):
        if await attempt(n):
            print(f"asyncpg {asyncpg.__version__}: stale statement refused (attempt {n})")
            return
    check(False, "the holder never got the client's server: nothing was shown")


asyncio.run(main())
