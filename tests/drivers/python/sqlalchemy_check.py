"""SQLAlchemy 2 (psycopg 3 dialect, default engine and pool) through Weir.

WEIR_URL names the pooler; ten threads share one engine of ten connections.
"""
import os
import threading

from sqlalchemy import create_engine, exc, text

URL = os.environ["WEIR_URL"].replace("postgresql://", "postgresql+psycopg://", 1)
engine = create_engine(URL, pool_size=10)
errors = []


def worker(n):
    try:
        with engine.connect() as conn:
            for i in range(8):
                got = conn.execute(text("SELECT :a + :b"), {"a": n, "b": i}).scalar()
                assert got == n + i, (got, n, i)
            conn.commit()
            try:
                with conn.begin():
                    conn.execute(text("SELECT 1/0"))
                raise AssertionError("division by zero did not fail")
            except exc.DataError:
                pass
            assert conn.execute(text("SELECT 42")).scalar() == 42
    except Exception as e:  # reported by the main thread
        errors.append(f"client {n}: {type(e).__name__}: {e}")


threads = [threading.Thread(target=worker, args=(n,)) for n in range(10)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, "\n".join(errors)
print("sqlalchemy: ok")
