"""Django's ORM on psycopg 3 through Weir in transaction mode, configured as a new user
would: ENGINE django.db.backends.postgresql and nothing else (client-side binding, a
connection per thread, server-side cursors for .iterator()).

The argument picks documented options on top of that: "defaults" (none), "pool"
(OPTIONS pool: True, a psycopg_pool shared by the threads) or "server-side-binding"
(OPTIONS server_side_binding: True, psycopg binds parameters on the server, and
prepare_threshold: 5: Django sets psycopg's prepare_threshold to None, "to keep
connection poolers working", unless OPTIONS gives one; with 5, psycopg's own default, a
query run more than 5 times on a connection becomes a named statement).

migrate runs Django's own migrations (contenttypes, auth) and those of django_drv, then
CLIENTS threads do ORM work at once; tests/driver_matrix.rs checks what PostgreSQL stored.
"""
import sys
import threading

import django
from django.conf import settings

from common import CLIENTS, DB, HOST, PORT, USER, check, run_clients

mode = sys.argv[1] if len(sys.argv) > 1 else "defaults"
options = {"defaults": {}, "pool": {"pool": True}, "server-side-binding": {"server_side_binding": True, "prepare_threshold": 5}}[mode]

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_drv"],
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": DB,
            "USER": USER,
            "HOST": HOST,
            "PORT": PORT,
            "OPTIONS": options,
        }
    },
    DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
)
django.setup()

from django.core.management import call_command  # noqa: E402 - needs django.setup()
from django.db import IntegrityError, connection, transaction  # noqa: E402
from django.db.models import Count, F, Sum  # noqa: E402

from django_drv.models import Account, Counter, Entry  # noqa: E402

call_command("migrate", verbosity=0)
# Tables made by migrate on a connection of this thread; the pool (if any) takes it back.
connection.close()

barrier = threading.Barrier(CLIENTS)


class Undo(Exception):
    pass


def client(i):
    try:
        work(i)
    finally:
        # Without a pool this closes the thread's connection; with one it goes back to the pool.
        connection.close()


def work(i):
    a = Account.objects.create(name=f"acct-{i}")
    Entry.objects.bulk_create([Entry(account=a, amount=k, note=f"bulk-{k}") for k in range(1, 51)])
    got = Entry.objects.filter(account=a).aggregate(n=Count("id"), s=Sum("amount"))
    check(got == {"n": 50, "s": 1275}, f"client {i}: aggregate {got}")
    Account.objects.filter(pk=a.pk).update(balance=F("balance") + got["s"])

    # Savepoints: a nested atomic() undone by an exception of the program's, another by
    # PostgreSQL's unique violation; the outer block goes on and commits.
    with transaction.atomic():
        Entry.objects.create(account=a, amount=1000, note="outer")
        try:
            with transaction.atomic():
                Entry.objects.create(account=a, amount=5000, note="inner-lost")
                raise Undo()
        except Undo:
            pass
        try:
            with transaction.atomic():
                Account.objects.create(name=f"acct-{i}")
        except IntegrityError:
            pass
        Entry.objects.create(account=a, amount=2000, note="after-savepoint")

    # A whole transaction rolled back.
    try:
        with transaction.atomic():
            Account.objects.filter(pk=a.pk).update(balance=-1)
            Entry.objects.create(account=a, amount=7000, note="lost")
            raise Undo()
    except Undo:
        pass
    a.refresh_from_db()
    check(a.balance == 1275, f"client {i}: balance {a.balance} after the rollback")

    # The others run their transactions meanwhile: the counter's row lock is contended.
    connection.close()
    barrier.wait()
    for _ in range(5):
        with transaction.atomic():
            c = Counter.objects.select_for_update().get(pk=1)
            c.value += 1
            c.save(update_fields=["value"])

    # .iterator() outside a transaction: a server-side cursor declared WITH HOLD, fetched
    # 7 rows at a time, each FETCH its own transaction.
    notes = [e.note for e in Entry.objects.filter(account=a).order_by("id").iterator(chunk_size=7)]
    check(len(notes) == 52 and notes[-1] == "after-savepoint", f"client {i}: iterator {len(notes)} {notes[-3:]}")
    with transaction.atomic():
        s = sum(e.amount for e in Entry.objects.filter(account=a).iterator(chunk_size=5))
    check(s == 4275, f"client {i}: iterator in atomic() {s}")

    # A query run often enough for psycopg to prepare it (server-side binding only).
    for k in range(8):
        n = Entry.objects.filter(account__name=f"acct-{i}", amount__gte=k).count()
        check(n == 52 - max(k - 1, 0), f"client {i}: count {n} for amount >= {k}")
    # psycopg's own record of the statements it prepared on this connection (not public API).
    prepared = len(connection.connection._prepared._names)
    check(prepared > 0 or mode != "server-side-binding", f"client {i}: psycopg prepared nothing")
    if i == 0:
        print(f"client 0: {prepared} statements prepared by psycopg")


run_clients(client, barrier, f"Django {django.get_version()} ({mode})")
check(Counter.objects.get(pk=1).value == 5 * CLIENTS, "counter")
connection.close()
