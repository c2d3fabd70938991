"""bench/run --soak: every request reaches PostgreSQL at most once, over a long run, under
churn (issue 24).

Clients (Python threads speaking the PostgreSQL protocol v3 over raw sockets, trust auth)
insert rows through Weir, each request an autocommit `insert into soak select <id> from
pg_sleep(<s>) returning id` with an id of its own, into a table with no unique key: a
request that ran twice shows as two rows, and an answer that is not its own request's
(another id returned) is a mix-up. Each client records what it was told about each request:

    ok        CommandComplete and ReadyForQuery: it ran, exactly once
    not run   SQLSTATE 57014 (cancelled: an autocommit statement cancelled is rolled
              back) or a query_wait_timeout error (refused before it was sent): no row
    unknown   any other error, the connection closing, or the client leaving with the
              request in flight: at most one row

Around them, mixed at random from a printed seed: clients that close their socket with a
request in flight, clients that leave right after their answer without Terminate, cancel
requests on a new connection, long inserts that hold a server past reserve_pool_timeout,
and a killer on a direct PostgreSQL connection terminating a random active insert every
0.5-2 s. The checks at the end are in check() below. Python 3 standard library only.
"""

import random
import re
import socket
import struct
import threading
import time

READ_TIMEOUT = 30.0  # seconds a client waits for any message; longer is a hang
PROGRESS_EVERY = 30.0
SETTLE_LIMIT = 30.0  # after the clients stop: SHOW POOLS must be quiet within this

# The RSS check: Weir's RSS when the clients stop may be at most RSS_FACTOR times its RSS
# after the first minute plus RSS_SLACK. The clients are a fixed crowd (40 connected at
# any time), so after the first minute Weir's memory should not grow with the number of
# requests served: every buffer, queue and map it keeps is per client, per server or per
# distinct statement (a few shapes here), all of them reached within the first minute.
# What may still move without a leak: the allocator (glibc keeps an arena per worker
# thread and does not always give pages back; fragmentation grows with the heap, hence a
# factor rather than only a constant) and bursts (a peak of logins, of waiting clients
# or of replies held while a server is lost can leave pages mapped: the 20 MB). A leak
# of the kind the soak is there to find, a few hundred bytes per request or a buffer per
# lost server or per vanished client, grows with the run: at the ~100-300 requests/s a
# debug build does here on 2 CPUs, 1 KB a request is 6-18 MB a minute, past the bound
# within a 10-minute soak. Shorter runs are a smoke test, not a leak test.
RSS_FACTOR = 1.5
RSS_SLACK = 20 * 2**20
RSS_BASE_AT = 60.0  # seconds: "after the first minute" (half the run if it is shorter)

TABLE = "soak"
INSERT = "insert into soak select {id} from pg_sleep({sleep}) returning id"
INSERT_EXT = "insert into soak select $1::bigint from pg_sleep($2::float8) returning id"
KILL_SQL = ("select pg_terminate_backend(pid) from (select pid from pg_stat_activity "
            "where query like 'insert into soak%' and state = 'active' "
            "order by random() limit 1) s")

# What a client does with one request: (name, share in percent).
KINDS = [
    ("simple", 40),         # Query, sleep 0-20 ms
    ("extended", 22),       # unnamed Parse/Bind/Execute/Sync, sleep 0-20 ms
    ("vanished", 10),       # Query, then the socket closed after 0-20 ms, no answer read
    ("answered-left", 8),   # Query, answer read, then the socket closed (no Terminate)
    ("cancelled", 8),       # Query with pg_sleep(0.1-0.3), CancelRequest after 0-150 ms
    ("long", 2),            # Query with pg_sleep(0.5)
    ("terminated", 10),     # Query, answer read, Terminate, then a new login
]
FATES = ("ok", "not_run", "unknown")


class Hang(Exception):
    pass


class LoginRefused(Exception):
    pass


def _cstr(s):
    return s.encode() + b"\0"


def _msg(tag, body):
    return tag + struct.pack("!i", len(body) + 4) + body


def query_msg(sql):
    return _msg(b"Q", _cstr(sql))


def extended_msgs(sql, params):
    bind = _cstr("") + _cstr("") + struct.pack("!hh", 0, len(params))
    for p in params:
        b = p.encode()
        bind += struct.pack("!i", len(b)) + b
    bind += struct.pack("!h", 0)
    return (_msg(b"P", _cstr("") + _cstr(sql) + struct.pack("!h", 0)) + _msg(b"B", bind)
            + _msg(b"E", _cstr("") + struct.pack("!i", 0)) + _msg(b"S", b""))


TERMINATE = _msg(b"X", b"")


def parse_error(body):
    fields = {}
    for part in body.split(b"\0"):
        if part:
            fields[chr(part[0])] = part[1:].decode(errors="replace")
    return {"severity": fields.get("V", fields.get("S", "")), "code": fields.get("C", ""),
            "message": fields.get("M", "")}


class Conn:
    """One protocol v3 connection: TCP (host, port) or a Unix socket path."""

    def __init__(self, addr, timeout=READ_TIMEOUT):
        if isinstance(addr, str):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        else:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(addr)
        except OSError:
            self.sock.close()
            raise
        self.buf = bytearray()
        self.key = None  # (pid, secret) from BackendKeyData

    def send(self, data):
        self.sock.sendall(data)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def vanish(self):
        """Gone without a word: both directions shut, then closed."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.close()

    def _fill(self, n):
        while len(self.buf) < n:
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                raise Hang(f"no message in {self.sock.gettimeout():.0f} s") from None
            except OSError:
                return False
            if not chunk:
                return False
            self.buf += chunk
        return True

    def read(self):
        """(tag, body), or None once the connection is closed."""
        if not self._fill(5):
            return None
        tag = bytes(self.buf[:1])
        n = struct.unpack("!i", self.buf[1:5])[0]
        if not self._fill(1 + n):
            return None
        body = bytes(self.buf[5:1 + n])
        del self.buf[:1 + n]
        return tag, body

    def startup(self, user, db):
        params = _cstr("user") + _cstr(user) + _cstr("database") + _cstr(db) + \
            _cstr("application_name") + _cstr("weir-soak") + b"\0"
        self.send(struct.pack("!ii", len(params) + 8, 196608) + params)
        while True:
            m = self.read()
            if m is None:
                raise LoginRefused("closed during login")
            tag, body = m
            if tag == b"R":
                code = struct.unpack("!i", body[:4])[0]
                if code != 0:
                    raise LoginRefused(f"authentication request {code} (trust expected)")
            elif tag == b"K":
                self.key = struct.unpack("!ii", body[:8])
            elif tag == b"E":
                e = parse_error(body)
                raise LoginRefused(f"{e['code']} {e['message']}")
            elif tag == b"Z":
                return self

    def answer(self):
        """Reads one request's answer: ("ok", None, values), ("error", err, values) at its
        ReadyForQuery, or ("closed", err or None, values); values: the first column of
        each DataRow (the ids RETURNING gave back)."""
        err, values = None, []
        while True:
            m = self.read()
            if m is None:
                return "closed", err, values
            tag, body = m
            if tag == b"D":
                n = struct.unpack("!i", body[2:6])[0] if len(body) >= 6 else -1
                values.append(body[6:6 + n].decode(errors="replace") if n >= 0 else None)
            elif tag == b"E":
                err = parse_error(body)
            elif tag == b"Z":
                return ("error", err, values) if err else ("ok", None, values)

    def query(self, sql):
        """Simple query returning rows of text (None for NULL); raises on an error."""
        self.send(query_msg(sql))
        rows, err = [], None
        while True:
            m = self.read()
            if m is None:
                raise OSError(f"connection closed during {sql!r}")
            tag, body = m
            if tag == b"D":
                n = struct.unpack("!h", body[:2])[0]
                pos, row = 2, []
                for _ in range(n):
                    ln = struct.unpack("!i", body[pos:pos + 4])[0]
                    pos += 4
                    if ln < 0:
                        row.append(None)
                    else:
                        row.append(body[pos:pos + ln].decode())
                        pos += ln
                rows.append(row)
            elif tag == b"T":
                n = struct.unpack("!h", body[:2])[0]
                pos, cols = 2, []
                for _ in range(n):
                    end = body.index(b"\0", pos)
                    cols.append(body[pos:end].decode())
                    pos = end + 1 + 18
                self.columns = cols
            elif tag == b"E":
                err = parse_error(body)
            elif tag == b"Z":
                if err:
                    raise OSError(f"{sql!r}: {err['code']} {err['message']}")
                return rows


def fate_of(result, err):
    if result == "ok":
        return "ok"
    if err and (err["code"] == "57014" or "query_wait_timeout" in err["message"]):
        return "not_run"
    return "unknown"


def told_of(result, err):
    if result == "ok":
        return "ok"
    text = f"{err['severity']} {err['code']} {err['message']}" if err else "no error"
    return f"{result}: {text}"


class Soak:
    def __init__(self, weir_port, pg_socket, weir_pid, user, db, seed, clients, minutes,
                 log):
        self.weir = ("127.0.0.1", weir_port)
        self.pg_socket = pg_socket
        self.weir_pid = weir_pid
        self.user, self.db = user, db
        self.seed = seed
        self.n_clients = clients
        self.seconds = minutes * 60.0
        self.log = log
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.next_id = 1
        # id -> [fate, kind, told, whether its connection had sent a cancel before]
        self.records = {}
        self.counts = {f: 0 for f in FATES}
        self.by_kind = {k: {f: 0 for f in FATES} for k, _ in KINDS}
        self.hangs = []  # what hung, with the id and when
        self.mixups = []  # answers carrying another request's id
        self.login_refused = 0
        self.login_refused_sample = None
        self.kills = 0
        self.killer_errors = 0
        self.threads_done = set()
        self.t0 = None

    # -- ids and records
    def new_id(self, kind, cancelled_before):
        with self.lock:
            i = self.next_id
            self.next_id += 1
            # Recorded before it is sent: a row whose request was never told of still
            # has a record (unknown), and a row with no record at all is a mix-up.
            self.records[i] = ["unknown", kind, "not answered yet", cancelled_before]
            return i

    def settle_record(self, i, fate, told):
        with self.lock:
            rec = self.records[i]
            rec[0], rec[2] = fate, told
            self.counts[fate] += 1
            self.by_kind[rec[1]][fate] += 1

    def hang(self, what, i, client):
        t = time.monotonic() - self.t0
        with self.lock:
            self.hangs.append({"client": client, "id": i, "what": what, "at_s": round(t, 1)})
        self.log(f"soak: HANG: client {client}: {what} (id {i}, {t:.1f} s into the run)")

    # -- one client
    def client(self, n):
        rng = random.Random(self.seed * 1000 + n)
        kinds = [k for k, share in KINDS for _ in range(share)]
        conn = None
        while not self.stop.is_set():
            if conn is None:
                try:
                    conn = Conn(self.weir).startup(self.user, self.db)
                    # Has this connection sent a cancel yet? A late cancel may end the
                    # connection's next request (as with PgBouncer); one that never sent
                    # any should only ever be cancelled by someone else's.
                    cancelled_before = False
                except Hang as e:
                    self.hang(f"login: {e}", None, n)
                    conn = None
                    continue
                except (LoginRefused, OSError) as e:
                    with self.lock:
                        self.login_refused += 1
                        self.login_refused_sample = self.login_refused_sample or str(e)
                    conn = None
                    time.sleep(0.05)
                    continue
            kind = rng.choice(kinds)
            i = self.new_id(kind, cancelled_before)
            sleep = rng.choice(("0", "0", "0.001", "0.005", "0.01", "0.02"))
            keep = True
            try:
                if kind == "extended":
                    conn.send(extended_msgs(INSERT_EXT, [str(i), sleep]))
                elif kind == "cancelled":
                    conn.send(query_msg(INSERT.format(id=i, sleep=f"0.{rng.randint(1, 3)}")))
                elif kind == "long":
                    conn.send(query_msg(INSERT.format(id=i, sleep="0.5")))
                else:
                    conn.send(query_msg(INSERT.format(id=i, sleep=sleep)))
                if kind == "vanished":
                    time.sleep(rng.uniform(0, 0.02))
                    conn.vanish()
                    conn = None
                    self.settle_record(i, "unknown", "left with the request in flight")
                    continue
                if kind == "cancelled":
                    time.sleep(rng.uniform(0, 0.15))
                    self.cancel(conn.key, n, i)
                    cancelled_before = True
                result, err, values = conn.answer()
            except Hang as e:
                self.hang(f"{kind} request: {e}", i, n)
                self.settle_record(i, "unknown", f"hang: {e}")
                conn.close()
                conn = None
                continue
            except OSError as e:
                # The send failed: the connection was gone before the request left, or
                # with it partly sent.
                self.settle_record(i, "unknown", f"send failed: {e}")
                conn.close()
                conn = None
                continue
            if values and values != [str(i)] or (result == "ok" and not values):
                # Told about another request (or nothing): what it says of this one is
                # worth nothing, so this one is unknown, and the mix-up is a failure.
                with self.lock:
                    self.mixups.append({"client": n, "id": i, "kind": kind,
                                        "returned": values, "result": result})
                self.log(f"soak: MIX-UP: client {n}: id {i} ({kind}) answered with "
                         f"{values} ({result})")
                self.settle_record(i, "unknown", f"mixed up: returned {values}")
                conn.close()
                conn = None
                continue
            self.settle_record(i, fate_of(result, err), told_of(result, err))
            if result == "closed" or (err and err["severity"] in ("FATAL", "PANIC")):
                keep = False
            if kind == "answered-left":
                conn.vanish()
                keep = False
            elif kind == "terminated":
                try:
                    conn.send(TERMINATE)
                except OSError:
                    pass
                conn.close()
                keep = False
            if not keep:
                conn.close()
                conn = None
        if conn is not None:
            try:
                conn.send(TERMINATE)
            except OSError:
                pass
            conn.close()
        with self.lock:
            self.threads_done.add(n)

    def cancel(self, key, n, i):
        if key is None:
            return
        try:
            k = Conn(self.weir)
        except OSError:
            return
        try:
            k.send(struct.pack("!iiii", 16, 80877102, key[0], key[1]))
            # The pooler closes a cancel connection once it has passed the cancel on.
            while k.read() is not None:
                pass
        except Hang:
            self.hang("the cancel connection was never closed", i, n)
        except OSError:
            pass
        finally:
            k.close()

    # -- the killer: a direct PostgreSQL connection
    def killer(self):
        rng = random.Random(self.seed ^ 0x6b696c6c)
        conn = None
        while not self.stop.wait(rng.uniform(0.5, 2.0)):
            try:
                if conn is None:
                    conn = Conn(self.pg_socket).startup("postgres", self.db)
                rows = conn.query(KILL_SQL)
                with self.lock:
                    self.kills += sum(1 for r in rows if r[0] == "t")
            except (OSError, Hang, LoginRefused) as e:
                self.killer_errors += 1
                if self.killer_errors <= 3:
                    self.log(f"soak: killer: {e}")
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()

    # -- observing
    def rss(self):
        try:
            with open(f"/proc/{self.weir_pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return None

    def pg(self):
        return Conn(self.pg_socket).startup("postgres", self.db)

    def duplicates(self, conn, limit=20):
        return conn.query(f"select id, count(*) from {TABLE} group by id "
                          f"having count(*) > 1 order by id limit {limit}")

    def show_pools(self, console):
        """(cl_waiting, sv_active, cl_active) summed over the pools of database `db`."""
        rows = console.query("SHOW POOLS")
        cols = console.columns
        ours = [dict(zip(cols, r)) for r in rows]
        ours = [r for r in ours if r.get("database") == self.db]
        return tuple(sum(int(r.get(c) or 0) for r in ours)
                     for c in ("cl_waiting", "sv_active", "cl_active"))

    def console(self):
        return Conn(self.weir, timeout=10).startup("postgres", "pgbouncer")

    def progress(self, pgc, console, rss, label):
        try:
            dups = self.duplicates(pgc)
        except (OSError, Hang) as e:
            dups = None
            self.log(f"soak: duplicate check failed: {e}")
        try:
            waiting, active, cl_active = self.show_pools(console)
            pools = f"cl_waiting {waiting} sv_active {active} cl_active {cl_active}"
        except (OSError, Hang) as e:
            pools = f"SHOW POOLS failed: {e}"
        with self.lock:
            c = dict(self.counts)
            kills, hangs = self.kills, len(self.hangs)
        self.log(f"soak {label}: requests ok {c['ok']} / not run {c['not_run']} / unknown "
                 f"{c['unknown']}; duplicates "
                 f"{'?' if dups is None else len(dups)}"
                 f"{' ' + str(dups[:5]) if dups else ''}; Weir RSS "
                 f"{rss / 2**20 if rss else 0:.1f} MiB; {pools}; kills {kills}; "
                 f"hangs {hangs}")
        return dups

    # -- the run
    def run(self, weir_alive):
        self.log(f"soak: seed {self.seed}, {self.n_clients} clients, "
                 f"{self.seconds / 60:g} minutes")
        setup = self.pg()
        setup.query(f"drop table if exists {TABLE}")
        setup.query(f"create table {TABLE} (id bigint)")  # no unique key, on purpose
        console = self.console()
        self.t0 = time.monotonic()
        threads = [threading.Thread(target=self.client, args=(n,), daemon=True,
                                    name=f"soak-client-{n}") for n in range(self.n_clients)]
        killer = threading.Thread(target=self.killer, daemon=True, name="soak-killer")
        for t in threads:
            t.start()
        killer.start()
        base_at = min(RSS_BASE_AT, self.seconds / 2)
        rss_base = None
        rss_samples = []  # (seconds, bytes)
        rss_last = None
        next_progress = PROGRESS_EVERY
        end = self.t0 + self.seconds
        died = False
        while True:
            now = time.monotonic()
            if now >= end:
                break
            time.sleep(min(1.0, end - now))
            t = time.monotonic() - self.t0
            if not weir_alive():
                died = True
                self.log("soak: Weir exited during the run")
                break
            r = self.rss()
            if r is not None:
                rss_last = r
                if rss_base is None and t >= base_at:
                    rss_base = r
                    self.log(f"soak: Weir RSS after {base_at:g} s: {r / 2**20:.1f} MiB")
            if t >= next_progress:
                next_progress += PROGRESS_EVERY
                rss_samples.append((round(t), r))
                try:
                    self.progress(setup, console, r, f"{t:5.0f}s")
                except Hang as e:
                    self.log(f"soak: progress: {e}")
        # Clients finish the request in hand (each read waits at most READ_TIMEOUT).
        self.stop.set()
        rss_end = rss_last
        stop_t = time.monotonic()
        for t in threads + [killer]:
            t.join(max(0.1, stop_t + READ_TIMEOUT + 10 - time.monotonic()))
        stuck = [t.name for t in threads + [killer] if t.is_alive()]
        for name in stuck:
            self.hang(f"thread {name} still running {READ_TIMEOUT + 10:.0f} s after the stop",
                      None, name)
        self.log(f"soak: clients stopped ({time.monotonic() - stop_t:.1f} s)")

        # After the clients: every server given back, nobody waiting.
        settle = {"settled": False}
        deadline = time.monotonic() + SETTLE_LIMIT
        last = None
        t_set = time.monotonic()
        while not died and time.monotonic() < deadline:
            try:
                last = self.show_pools(console)
            except (OSError, Hang) as e:
                last = str(e)
                try:
                    console.close()
                    console = self.console()
                except (OSError, Hang, LoginRefused):
                    pass
            if isinstance(last, tuple) and last[0] == 0 and last[1] == 0:
                settle = {"settled": True, "seconds": round(time.monotonic() - t_set, 1)}
                break
            time.sleep(0.2)
        settle["last"] = last
        rss_after = self.rss()
        final_dups = self.progress(setup, console, rss_end, "end  ")
        pipelined = None
        try:
            rows = console.query("SHOW STATS")
            for r in rows:
                r = dict(zip(console.columns, r))
                if r.get("database") == self.db and r.get("total_pipelined_count"):
                    pipelined = int(r["total_pipelined_count"])
        except (OSError, Hang, ValueError) as e:
            self.log(f"soak: SHOW STATS: {e}")
        return self.check(setup, died, rss_base, base_at, rss_end, rss_after, rss_samples,
                          settle, final_dups, pipelined)

    def check(self, pgc, died, rss_base, base_at, rss_end, rss_after, rss_samples, settle,
              dups, pipelined):
        failures = []
        seen = {int(i): int(n) for i, n in pgc.query(
            f"select id, count(*) from {TABLE} group by id")}
        with self.lock:
            records = dict(self.records)
        wrong = []
        for i, n in sorted(seen.items()):
            rec = records.get(i)
            if n > 1:
                wrong.append(f"id {i} ran {n} times ({rec[1]}: told {rec[2]})" if rec else
                             f"id {i} ran {n} times (never sent by a client)")
            elif rec is None:
                wrong.append(f"id {i} is in the table but no client sent it")
        for i, (fate, kind, told, _) in sorted(records.items()):
            n = seen.get(i, 0)
            if fate == "ok" and n != 1:
                wrong.append(f"id {i} ({kind}) was answered ok but has {n} rows")
            elif fate == "not_run" and n != 0:
                wrong.append(f"id {i} ({kind}) was told '{told}' (not run) but has {n} rows")
        if wrong:
            failures.append(f"{len(wrong)} request(s) not run at most once as told: "
                            + "; ".join(wrong[:20]))
        if self.mixups:
            failures.append(f"{len(self.mixups)} answer(s) of another request: "
                            + "; ".join(f"client {m['client']} id {m['id']} ({m['kind']}) "
                                        f"got {m['returned']}" for m in self.mixups[:10]))
        if self.hangs:
            failures.append(f"{len(self.hangs)} hang(s): "
                            + "; ".join(f"client {h['client']} id {h['id']}: {h['what']} "
                                        f"at {h['at_s']} s" for h in self.hangs[:10]))
        if died:
            failures.append("Weir exited during the run")
        if not settle["settled"]:
            failures.append(f"SHOW POOLS did not reach sv_active 0 and cl_waiting 0 within "
                            f"{SETTLE_LIMIT:.0f} s of the clients' stop (last: "
                            f"cl_waiting, sv_active, cl_active = {settle['last']})")
        bound = None
        if rss_base is None or rss_end is None:
            failures.append("Weir's RSS could not be read")
        else:
            bound = RSS_FACTOR * rss_base + RSS_SLACK
            if rss_end > bound:
                failures.append(f"Weir's RSS grew: {rss_end / 2**20:.1f} MiB at the end > "
                                f"{RSS_FACTOR} x {rss_base / 2**20:.1f} MiB (after "
                                f"{base_at:g} s) + {RSS_SLACK / 2**20:.0f} MiB")
        told = {}  # fate -> what the clients were told (ids left out) -> how often
        # Requests cancelled that asked for no cancel: by a late cancel of an earlier
        # request on the same connection, or by another client's (which only a pooler
        # that sent the cancel to a server already running someone else's request
        # could do). Not run, so not an at-most-once failure: counted and reported.
        stray = {"same_connection": 0, "other_client": 0, "other_client_ids": []}
        for i, (fate, kind, text, before) in sorted(records.items()):
            if kind != "cancelled" and "57014" in text:
                stray["same_connection" if before else "other_client"] += 1
                if not before and len(stray["other_client_ids"]) < 20:
                    stray["other_client_ids"].append(i)
        for fate, kind, text, _ in records.values():
            text = re.sub(r"\d+", "N", text)[:200]
            by = told.setdefault(fate, {})
            by[text] = by.get(text, 0) + 1
        told = {f: dict(sorted(by.items(), key=lambda kv: -kv[1])[:12])
                for f, by in told.items()}
        if self.counts["ok"] == 0:
            failures.append("no request was answered ok")
        with self.lock:
            summary = {
                "seed": self.seed, "minutes": self.seconds / 60, "clients": self.n_clients,
                "requests": len(records), "fates": dict(self.counts),
                "by_kind": self.by_kind, "told": told, "stray_cancels": stray, "rows": sum(seen.values()),
                "duplicates": sum(1 for n in seen.values() if n > 1),
                "duplicates_sample": [f"{i}x{n}" for i, n in seen.items() if n > 1][:20],
                "wrong": wrong[:100], "hangs": self.hangs, "mixups": self.mixups[:100],
                "pipelined": pipelined, "kills": self.kills,
                "killer_errors": self.killer_errors,
                "logins_refused": self.login_refused,
                "login_refused_sample": self.login_refused_sample,
                "rss_base_bytes": rss_base, "rss_base_at_s": base_at,
                "rss_end_bytes": rss_end, "rss_after_settle_bytes": rss_after,
                "rss_bound_bytes": bound, "rss_factor": RSS_FACTOR,
                "rss_slack_bytes": RSS_SLACK, "rss_samples": rss_samples,
                "settle": settle, "weir_died": died,
                "failures": failures, "passed": not failures,
            }
        return summary
