"""SQLAlchemy 2's ORM on asyncpg (create_async_engine("postgresql+asyncpg://...")) at its
defaults through Weir in transaction mode: a QueuePool of 5 (+10 overflow), asyncpg's
statement cache (every query a named statement __asyncpg_stmt_N__) and the dialect's own
cache of 100 prepared statements per connection (__asyncpg_<uuid>__ is only the
PgBouncer recipe, not the default).

CLIENTS tasks share one engine; tests/driver_matrix.rs checks what PostgreSQL stored.
Then "cached statement plan is invalid": a column's type changes under statements that
pooled connections cached, by DDL from another engine, as a migration in another process
would do it.
"""
import asyncio

import asyncpg
import sqlalchemy
from sqlalchemy import ForeignKey, String, func, select, text, update
from sqlalchemy.exc import DBAPIError, IntegrityError, NotSupportedError
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from common import CLIENTS, DB, HOST, PORT, USER, check

URL = f"postgresql+asyncpg://{USER}@{HOST}:{PORT}/{DB}"


class Base(DeclarativeBase):
    pass


class Owner(Base):
    __tablename__ = "sqla_owner"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(50), unique=True)
    total: Mapped[int] = mapped_column(default=0)


class Item(Base):
    __tablename__ = "sqla_item"
    id: Mapped[int] = mapped_column(primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("sqla_owner.id"))
    qty: Mapped[int]
    note: Mapped[str] = mapped_column(String(50), default="")


class Undo(Exception):
    pass


async def client(i, Session, barrier):
    async with Session() as s:
        async with s.begin():
            o = Owner(name=f"owner-{i}")
            s.add(o)
            await s.flush()
            s.add_all([Item(owner_id=o.id, qty=k, note=f"item-{k}") for k in range(1, 21)])
        # A rollback expires the session's objects: o.id would then be loaded again, lazily.
        oid = o.id

        # A SAVEPOINT undone by PostgreSQL's unique violation; the transaction goes on.
        async with s.begin():
            s.add(Item(owner_id=oid, qty=100, note="outer"))
            try:
                async with s.begin_nested():
                    s.add(Owner(name=f"owner-{i}"))
            except IntegrityError:
                pass
            s.add(Item(owner_id=oid, qty=200, note="after-savepoint"))

        # Whole transactions rolled back: by an error of PostgreSQL's, by the program.
        try:
            async with s.begin():
                s.add(Item(owner_id=oid, qty=9000, note="lost"))
                await s.flush()
                await s.execute(text("select 1 / (:a - :a)").bindparams(sqlalchemy.bindparam("a", type_=sqlalchemy.Integer)), {"a": i})
            check(False, "division by zero was not raised")
        except DBAPIError:
            pass
        try:
            async with s.begin():
                await s.execute(update(Owner).where(Owner.id == oid).values(total=-1))
                raise Undo()
        except Undo:
            pass

    # No transaction is open here: the others need the two servers to reach the barrier.
    await barrier.wait()

    async with Session() as s:
        # The same statements again and again: each connection's caches serve them.
        for k in range(8):
            n = await s.scalar(select(func.count()).select_from(Item)
                               .where(Item.owner_id == oid, Item.qty >= k))
            check(n == 22 - max(k - 1, 0), f"client {i}: count {n} for qty >= {k}")
            await s.commit()
        async with s.begin():
            total = await s.scalar(select(func.sum(Item.qty)).where(Item.owner_id == oid))
            await s.execute(update(Owner).where(Owner.id == oid).values(total=Owner.total + total))
        owner = await s.get(Owner, oid)
        check(owner.total == 510, f"client {i}: total {owner.total}")
        notes = (await s.scalars(select(Item.note).where(Item.owner_id == oid).order_by(Item.id))).all()
        check(notes[-2:] == ["outer", "after-savepoint"] and len(notes) == 22, f"client {i}: {notes[-3:]}")


async def stale_plan(engine):
    """A column's type changes under statements cached on every pooled connection."""
    async with engine.begin() as conn:
        await conn.execute(text("create table sqla_ddl (id int primary key, v int)"))
        await conn.execute(text("insert into sqla_ddl values (1, 41), (2, 42)"))
    query = select(text("v")).select_from(text("sqla_ddl")).order_by(text("id"))

    async def read(conn):
        return (await conn.execute(query)).scalars().all()

    # Five pooled connections (the pool's size) cache the statement, two at a time in a
    # transaction each: both servers hold it. (A server that never held it would prepare
    # it afresh, of the new type, and asyncpg would read that with its old description:
    # see asyncpg_stale_plan.py.)
    conns = [await engine.connect() for _ in range(5)]
    for a, b in [(0, 1), (2, 3), (4, 0)]:
        for c in (conns[a], conns[b]):
            check(await read(c) == [41, 42], "before the DDL")
        await conns[a].commit()
        await conns[b].commit()
    for c in conns:
        await c.close()

    # Another engine (another process, in an application) changes the column's type.
    other = create_async_engine(URL)
    async with other.begin() as conn:
        await conn.execute(text("alter table sqla_ddl alter column v type text using 'v' || v"))
    await other.dispose()

    # Each connection may get asyncpg's InvalidCachedStatementError once (PostgreSQL's
    # "cached plan must not change result type"; SQLAlchemy then clears its caches and
    # cannot retry: the transaction is lost); the next try must read the new type.
    refused = 0
    for _ in range(5):
        async with engine.connect() as c:
            try:
                got = await read(c)
            except NotSupportedError as e:
                check("InvalidCachedStatementError" in str(e), f"stale plan: {e}")
                refused += 1
                await c.rollback()
                got = await read(c)
            check(got == ["v41", "v42"], f"after the DDL: {got!r}")
    # As directly: the first refusal clears the caches of every connection of the engine.
    check(refused == 1, f"stale plan refused {refused} times")
    return refused


async def main():
    engine = create_async_engine(URL)
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    Session = async_sessionmaker(engine, expire_on_commit=False)
    barrier = asyncio.Barrier(CLIENTS)

    async def run(i):
        try:
            await client(i, Session, barrier)
        except BaseException:
            await barrier.abort()
            raise

    results = await asyncio.gather(*(run(i) for i in range(CLIENTS)), return_exceptions=True)
    failed = [f"client {i}: {type(r).__name__}: {r}" for i, r in enumerate(results) if isinstance(r, BaseException)]
    for f in failed:
        print(f)
    check(not failed, f"{len(failed)} client(s) failed")
    refused = await stale_plan(engine)
    await engine.dispose()
    print(f"SQLAlchemy {sqlalchemy.__version__} on asyncpg {asyncpg.__version__}: {CLIENTS} clients ok; "
          f"stale plan refused {refused} time(s)")


asyncio.run(main())
