"""Connection parameters the driver matrix (tests/driver_matrix.rs) passes in env."""
import os
import sys

HOST = os.environ["WEIR_HOST"]
PORT = int(os.environ["WEIR_PORT"])
DB = os.environ["WEIR_DB"]
USER = os.environ["WEIR_USER"]
CLIENTS = int(os.environ.get("WEIR_CLIENTS", "10"))


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr, flush=True)
        sys.exit(1)


def run_clients(client, barrier, label):
    """Runs client(i) for each of CLIENTS threads; exits 1 listing the clients that failed."""
    import threading

    errors = []

    def run(i):
        try:
            client(i)
        except BaseException as e:  # noqa: BLE001 - reported and turned into exit status 1
            errors.append(f"client {i}: {type(e).__name__}: {e}")
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        print(e)
    check(not errors, f"{len(errors)} client(s) failed")
    print(f"{label}: {CLIENTS} clients ok")
