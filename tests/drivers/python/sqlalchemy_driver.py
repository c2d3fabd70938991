"""SQLAlchemy 2 on psycopg 3 at its default settings (QueuePool, psycopg's
prepare_threshold) through Weir in transaction mode."""
import threading

from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, func, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from common import CLIENTS, DB, HOST, PORT, USER, check, run_clients

metadata = MetaData()
drv = Table("drv_sqlalchemy", metadata, Column("id", Integer, primary_key=True), Column("v", String))

# Two engines with different application_name: their connections share Weir's two servers.
engines = [
    create_engine(f"postgresql+psycopg://{USER}@{HOST}:{PORT}/{DB}?application_name=drv-sqla-{e}")
    for e in range(2)
]
barrier = threading.Barrier(CLIENTS)


def client(i):
    e = i % 2
    engine = engines[e]
    app = f"drv-sqla-{e}"
    for n in range(8):
        with engine.connect() as conn:
            row = conn.execute(select(func.current_setting("application_name"), drv.c.id).where(drv.c.id == -1)
                               .union_all(select(func.current_setting("application_name"), -1))).first()
            check(row[0] == app, f"client {i}: application_name {row[0]!r} != {app!r}")
        if n == 3:
            barrier.wait()
    with Session(engine) as s, s.begin():
        s.execute(drv.insert(), [{"id": i * 1000 + k, "v": f"o{i}-{k}"} for k in range(20)])
    with Session(engine) as s:
        for _ in range(7):
            got = s.execute(select(drv.c.v).where(drv.c.id >= i * 1000, drv.c.id < i * 1000 + 1000)
                            .order_by(drv.c.id)).scalars().all()
            check(got == [f"o{i}-{k}" for k in range(20)], f"client {i}: {got[:3]}")
    # An error mid-transaction rolls it back; the session works afterwards.
    with Session(engine) as s:
        try:
            with s.begin():
                s.execute(drv.insert(), {"id": i * 1000 + 999, "v": "lost"})
                s.execute(text("select 1 / (:a - :a)"), {"a": i})
            check(False, "division by zero was not raised")
        except DBAPIError:
            pass
        check(s.execute(select(func.count()).select_from(drv).where(drv.c.id == i * 1000 + 999)).scalar() == 0,
              f"client {i}: failed transaction's insert visible")
    # Session state (SET search_path) follows the client in transaction mode, and
    # no other client on the same server sees it.
    with engine.connect() as conn:
        conn.execute(text(f"set search_path to drv_schema_{i}, public"))
        # SQLAlchemy began a transaction: it must end for the others to get a server.
        conn.commit()
        barrier.wait()
        check(conn.execute(text("show search_path")).scalar() == f"drv_schema_{i}, public", "search_path")


run_clients(client, barrier, "SQLAlchemy on 2 engines")
