"""bench/run's network-delay mode (--delay, --delay-suite): a delay between the poolers
(and direct pgbench) and PostgreSQL on loopback, made by a proxy in user space.

The kernel here has no netem qdisc, so the delay is added by a proxy listening on a free
port in front of PostgreSQL, which holds every chunk for the delay in each direction. Two
proxies, with the same interface (command, process_env, ready, set_delay, listen_port,
delay_ms, version, name):

- Toxiproxy (`--proxy toxiproxy`): toxiproxy-server (scripts/install-toxiproxy) with a
  latency toxic on the upstream and the downstream stream, jitter 0. Its latency is an
  integer number of milliseconds (LatencyToxic.Latency is an int64 of ms in v2.5.0, and no
  finer option exists), so 0.25 ms cannot be expressed with it.
- weir-delay (`--proxy weir-delay`, crates/weir-delay): the project's own delay line, in
  microseconds, built by bench/run with cargo. The default when a delay is not a whole
  number of ms, and for --delay-suite (0, 0.25 and 1 ms through one proxy).

Both delay each chunk from the moment it was read, not from when the one before it left,
so back-to-back messages are not serialized behind each other: they behave like a link
with a fixed one-way delay.

Python 3 standard library only.
"""

import json
import math
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PROXY_NAME = "postgres"
# The custom script of single-statement autocommit writes (issue 16): one UPDATE of a
# random account, no BEGIN/COMMIT. `scale` is set with -D (pgbench's own -s is not
# consulted for custom scripts).
UPDATE_SCRIPT = ("\\set aid random(1, 100000 * :scale)\n"
                 "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\n")
SELECT1_SCRIPT = "SELECT 1;\n"
LATAVG_RE = re.compile(r"latency average = ([0-9.]+) ms")


class DelayError(Exception):
    pass


PROXIES = ("toxiproxy", "weir-delay")


def parse_delays(text):
    """'0,0.25,1' -> [0, 0.25, 1] (ms each way; whole ms as int). Whole microseconds at
    most (weir-delay's unit); whether the proxy can express them is checked_for_proxy's
    business, once --proxy is known."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            v = float(part)
        except ValueError:
            raise ValueError(f"--delay: {part!r} is not a number of milliseconds") from None
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"--delay: {part} is not a delay (0 or more milliseconds)")
        if abs(v * 1000 - round(v * 1000)) > 1e-6:
            raise ValueError(f"--delay: {part} ms is not a whole number of microseconds")
        v = int(v) if v == int(v) else round(v, 3)
        if v not in out:
            out.append(v)
    if not out:
        raise ValueError("--delay: no delay given")
    return out


def default_proxy(delays):
    """Toxiproxy where it can express every delay (whole ms), else weir-delay."""
    return "toxiproxy" if all(d == int(d) for d in delays) else "weir-delay"


def check_for_proxy(delays, proxy):
    """Refuses a fraction of a ms for Toxiproxy: a silently rounded 0.25 would measure 0
    or 1 ms under the wrong label."""
    if proxy == "toxiproxy":
        for d in delays:
            if d != int(d):
                raise ValueError(
                    f"--delay: {d} ms cannot be expressed: Toxiproxy's latency toxic takes "
                    "whole milliseconds (LatencyToxic.Latency is an integer of ms); use 0, 1, "
                    "2, ... or --proxy weir-delay")


def find_toxiproxy():
    """The toxiproxy-server binary, built by scripts/install-toxiproxy if missing."""
    r = subprocess.run([str(REPO / "scripts" / "install-toxiproxy")], capture_output=True,
                       text=True)
    path = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    if r.returncode != 0 or not os.access(path, os.X_OK):
        raise DelayError(f"scripts/install-toxiproxy failed:\n{r.stderr[-2000:]}")
    return path


class Toxiproxy:
    """One toxiproxy-server with one proxy in front of PostgreSQL. The caller starts the
    process (so that its own cleanup tracks it) with `command()` and then calls `ready()`."""
    name = "toxiproxy"

    def __init__(self, binary, api_port, listen_port, upstream_port):
        self.binary = binary
        self.api_port = api_port
        self.listen_port = listen_port
        self.upstream_port = upstream_port
        self.delay_ms = 0

    def command(self):
        return [self.binary, "-host", "127.0.0.1", "-port", str(self.api_port)]

    @staticmethod
    def process_env():
        # Every connection would be logged at info level.
        return dict(os.environ, LOG_LEVEL="warn")

    def _call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.api_port}{path}", data=data,
                                     method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as e:
            raise DelayError(f"toxiproxy {method} {path}: HTTP {e.code} "
                             f"{e.read().decode(errors='replace')[:300]}") from None
        except OSError as e:
            raise DelayError(f"toxiproxy {method} {path}: {e}") from None
        try:
            return json.loads(text) if text.strip() else None
        except ValueError:
            return text.strip()  # /version is plain text in v2.5.0 (JSON in later ones)

    def ready(self, proc, limit=20.0):
        """Waits for the API, then creates the proxy (listen -> PostgreSQL), no toxics."""
        deadline = time.monotonic() + limit
        while True:
            if proc.poll() is not None:
                raise DelayError(f"toxiproxy-server exited at startup (rc {proc.returncode})")
            try:
                v = self._call("GET", "/version")
                self.version = v.get("version", v) if isinstance(v, dict) else v
                break
            except DelayError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self._call("POST", "/proxies", {
            "name": PROXY_NAME, "listen": f"127.0.0.1:{self.listen_port}",
            "upstream": f"127.0.0.1:{self.upstream_port}", "enabled": True})

    def set_delay(self, ms):
        """`ms` milliseconds each way (0: no toxic). Toxics apply to open connections too,
        but bench/run restarts the poolers after a change anyway."""
        for t in self._call("GET", f"/proxies/{PROXY_NAME}/toxics") or []:
            self._call("DELETE", f"/proxies/{PROXY_NAME}/toxics/{t['name']}")
        if ms:
            for stream in ("upstream", "downstream"):
                self._call("POST", f"/proxies/{PROXY_NAME}/toxics", {
                    "name": f"latency_{stream}", "type": "latency", "stream": stream,
                    "toxicity": 1.0, "attributes": {"latency": int(ms), "jitter": 0}})
        got = self._call("GET", f"/proxies/{PROXY_NAME}/toxics") or []
        lat = sorted((t["stream"], t["attributes"]["latency"]) for t in got)
        want = [("downstream", ms), ("upstream", ms)] if ms else []
        if lat != want:
            raise DelayError(f"toxiproxy toxics are {lat}, wanted {want}")
        self.delay_ms = ms


def find_weir_delay(cargo):
    """crates/weir-delay's binary, built (or found up to date) by cargo in the release
    profile; an existing binary is used when cargo is missing."""
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    binary = target / "release" / "weir-delay"
    try:
        r = subprocess.run([cargo, "build", "--release", "-p", "weir-delay"], cwd=REPO,
                           capture_output=True, text=True)
    except OSError as e:
        if os.access(binary, os.X_OK):
            return str(binary)
        raise DelayError(f"cannot build weir-delay ({e}) and {binary} does not exist") from None
    if r.returncode != 0 or not os.access(binary, os.X_OK):
        raise DelayError(f"cargo build --release -p weir-delay failed:\n{r.stderr[-2000:]}")
    return str(binary)


class DelayProxy:
    """One weir-delay process in front of PostgreSQL, driven through its control port
    (`delay <us>`, `get`). The same interface as Toxiproxy; the delay is in whole
    microseconds, so fractions of a ms (0.25) are exact."""
    name = "weir-delay"

    def __init__(self, binary, control_port, listen_port, upstream_port):
        self.binary = binary
        self.control_port = control_port
        self.listen_port = listen_port
        self.upstream_port = upstream_port
        self.delay_ms = 0
        self.version = None

    def command(self):
        return [self.binary, "--listen", f"127.0.0.1:{self.listen_port}",
                "--upstream", f"127.0.0.1:{self.upstream_port}",
                "--control", f"127.0.0.1:{self.control_port}", "--delay-us", "0"]

    @staticmethod
    def process_env():
        return dict(os.environ)

    def _control(self, line):
        try:
            with socket.create_connection(("127.0.0.1", self.control_port), timeout=10) as s:
                s.sendall(line.encode() + b"\n")
                answer = b""
                while not answer.endswith(b"\n"):
                    more = s.recv(256)
                    if not more:
                        break
                    answer += more
        except OSError as e:
            raise DelayError(f"weir-delay control {line!r}: {e}") from None
        return answer.decode(errors="replace").strip()

    def ready(self, proc, limit=20.0):
        """Waits for the control port (it opens before the proxy says it is listening)."""
        deadline = time.monotonic() + limit
        while True:
            if proc.poll() is not None:
                raise DelayError(f"weir-delay exited at startup (rc {proc.returncode})")
            try:
                self._control("get")
                break
            except DelayError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        try:
            r = subprocess.run([self.binary, "--version"], capture_output=True, text=True,
                               timeout=10)
            self.version = r.stdout.strip().removeprefix("weir-delay ") or "?"
        except (OSError, subprocess.SubprocessError):
            self.version = "?"

    def set_delay(self, ms):
        """`ms` milliseconds each way, for every chunk read from now on (bench/run
        restarts the poolers after a change anyway)."""
        us = round(ms * 1000)
        answer = self._control(f"delay {us}")
        if answer != "ok":
            raise DelayError(f"weir-delay: 'delay {us}' answered {answer!r}")
        got = self._control("get")
        if got != str(us):
            raise DelayError(f"weir-delay delay is {got!r} us, wanted {us}")
        self.delay_ms = ms


def measure_rtt(pgbench, port, client_env, script, user, db, seconds=3):
    """Mean `SELECT 1` round trip (ms) of one pgbench client on `port` (a persistent
    connection, simple protocol): what one request/reply pair costs through that path."""
    cmd = [pgbench, "-n", "-h", "127.0.0.1", "-p", str(port), "-U", user, "-c", "1", "-j", "1",
           "-T", str(seconds), "-f", str(script), db]
    r = subprocess.run(cmd, capture_output=True, text=True, env=client_env,
                       timeout=seconds + 60)
    m = LATAVG_RE.search(r.stdout)
    if r.returncode != 0 or not m:
        raise DelayError(f"SELECT 1 round-trip check on port {port} failed:\n"
                         f"{r.stdout[-500:]}\n{r.stderr[-1000:]}")
    return float(m.group(1))


def check_delay(rtt_plain, rtt_proxy0, rtt_delayed, ms):
    """The line bench/run prints for one delay, and whether the delay is real: a request
    and its reply each cross the link once, so the round trip should grow by 2 x ms."""
    added = rtt_delayed - rtt_plain
    line = (f"delay {ms} ms each way: SELECT 1 round trip {rtt_delayed:.3f} ms through the "
            f"proxy vs {rtt_plain:.3f} ms without it ({rtt_proxy0:.3f} ms through the proxy "
            f"with no delay): {added:.3f} ms added per round trip (expected {2 * ms:g})")
    return line, added >= 2 * ms * 0.9


# --------------------------------------------------------------------------
# summary and plot

NAMES = {"direct": "direct", "pgbouncer": "PgBouncer", "weir-nopipe": "Weir nopipe",
         "weir": "Weir"}
ORDER = ("direct", "pgbouncer", "weir-nopipe", "weir")
POOLER_ORDER = ORDER[1:]


def print_delay_summary(rows, base_pool, clients, checks, out, proxy_name="toxiproxy"):
    """TPS per workload and delay at the base pool size (every target, and each Weir
    target against PgBouncer, Weir with pipelining against without, Weir against direct),
    then TPS against pool size, then the share of Weir's transactions sent pipelined."""
    lines = list(checks)
    wls = sorted({r["workload"] for r in rows}, key=["select", "update", "tpcb"].index)
    delays = sorted({r["delay_ms"] for r in rows})
    pools = sorted({r["pool"] for r in rows})
    targets = [t for t in ORDER if any(r["target"] == t for r in rows)]
    poolers = [t for t in POOLER_ORDER if t in targets]
    by = {(r["workload"], r["delay_ms"], r["pool"], r["target"]): r for r in rows}
    wname = {"select": "select-only (-S)", "update": "UPDATE by aid (autocommit)",
             "tpcb": "tpcb-like"}

    def cell(r, w=11):
        if r is None:
            return f"{'-':>{w}}"
        v = f"{r['tps']:,.0f}" if r["tps"] is not None else "-"
        return f"{v + ('' if r['status'] == 'ok' else '!'):>{w}}"

    def ratio(a, b):
        ok = a and b and a["tps"] and b["tps"] and a["status"] == "ok" == b["status"]
        return f"{a['tps'] / b['tps']:8.2f}" if ok else f"{'-':>8}"
    # Ratios: each Weir target against PgBouncer, pipelining on against off, Weir/direct.
    ratios = [(a, b, h) for a, b, h in (
        ("weir-nopipe", "pgbouncer", "nP/PgB"), ("weir", "pgbouncer", "W/PgB"),
        ("weir", "weir-nopipe", "W/nP"), ("weir", "direct", "W/dir"))
        if a in targets and b in targets]
    lines += ["", f"TPS, {clients} clients, pool size {base_pool} (direct: one connection per "
              "client, through the same delay"
              + ("; nP = weir-nopipe, pipelining off)" if "weir-nopipe" in targets else ")"),
              ""]
    lines.append(f"{'workload':<28} {'delay':>7} "
                 + " ".join(f"{NAMES[t]:>11}" for t in targets)
                 + "".join(f" {h:>8}" for _, _, h in ratios))
    for wl in wls:
        for d in delays:
            c = {t: by.get((wl, d, base_pool, t)) for t in targets}
            lines.append(f"{wname.get(wl, wl):<28} {f'{d} ms':>7} "
                         + " ".join(cell(c[t]) for t in targets)
                         + "".join(f" {ratio(c[a], c[b])}" for a, b, _ in ratios))
    if len(pools) > 1:
        title = " / ".join(NAMES[t] for t in poolers)
        table = {(wl, d, p): " / ".join(cell(by.get((wl, d, p, t))).strip() for t in poolers)
                 for wl in wls for d in delays for p in pools}
        w = max(len(v) for v in table.values()) + 1
        lines += ["", f"TPS against pool size ({title})", ""]
        lines.append(f"{'workload':<28} {'delay':>7} "
                     + " ".join(f"{f'pool {p}':>{w}}" for p in pools))
        for wl in wls:
            for d in delays:
                lines.append(f"{wname.get(wl, wl):<28} {f'{d} ms':>7} "
                             + " ".join(f"{table[(wl, d, p)]:>{w}}" for p in pools))
    piped = [r for r in rows if r.get("pipelined_share") is not None]
    if piped:
        lines += ["", "Share of Weir's transactions sent pipelined behind another "
                  "(SHOW STATS total_pipelined_count; weir-nopipe should be 0%)", ""]
        wt = [t for t in ("weir-nopipe", "weir") if t in targets]
        lines.append(f"{'workload':<28} {'delay':>7} {'target':>11} "
                     + " ".join(f"{f'pool {p}':>8}" for p in pools))
        for wl in wls:
            for d in delays:
                for t in wt:
                    vals = [by.get((wl, d, p, t)) for p in pools]
                    lines.append(f"{wname.get(wl, wl):<28} {f'{d} ms':>7} {t:>11} " + " ".join(
                        f"{v['pipelined_share']:8.0%}" if v and v.get("pipelined_share")
                        is not None else f"{'-':>8}" for v in vals))
    lines += acceptance_lines(by, wls, delays, pools, base_pool)
    proxy = [r for r in rows if r.get("proxy_s_per_1k_tx") is not None]
    if proxy:
        lines += ["", f"{proxy_name} CPU s per 1k transactions (median over targets): "
                  + ", ".join(f"{wl} {d} ms {m:.4f}" for wl in wls for d in delays
                              if (m := _median([r["proxy_s_per_1k_tx"] for r in proxy
                                                if r["workload"] == wl
                                                and r["delay_ms"] == d])) is not None)]
    text = "\n".join(lines) + "\n"
    out.write(text)
    return text


def acceptance_lines(by, wls, delays, pools, base_pool):
    """Issue 16's acceptance figures, where the run has them: weir / PgBouncer at 1 ms and
    the base pool for select-only and update (wanted: 2 or more), and weir / weir-nopipe
    with no delay and for tpcb-like (wanted: never below 1; one run is noisy, read it with
    --repeat)."""
    def r(wl, d, p, t):
        x = by.get((wl, d, p, t))
        return x["tps"] if x and x["status"] == "ok" and x["tps"] else None
    out = []
    for wl in ("select", "update"):
        if wl in wls and 1 in delays:
            w, b = r(wl, 1, base_pool, "weir"), r(wl, 1, base_pool, "pgbouncer")
            if w and b:
                out.append(f"  {wl}, 1 ms, pool {base_pool}: weir / pgbouncer = {w / b:.2f} "
                           f"(wanted >= 2: {'yes' if w / b >= 2 else 'NO'})")
    checks = [(wl, d) for wl in wls for d in delays if d == 0 or wl == "tpcb"]
    for wl, d in checks:
        rs = [(p, r(wl, d, p, "weir"), r(wl, d, p, "weir-nopipe")) for p in pools]
        rs = [(p, w / n) for p, w, n in rs if w and n]
        if rs:
            low = min(v for _, v in rs)
            out.append(f"  {wl}, {d} ms: weir / weir-nopipe by pool size "
                       + ", ".join(f"{p}: {v:.2f}" for p, v in rs)
                       + f" (wanted never below 1: lowest {low:.2f})")
    return ["", "Issue 16's acceptance (one run each: noise of ~10% is usual here)"] + out \
        if out else []


def _median(vals):
    vals = sorted(vals)
    if not vals:
        return None
    n = len(vals)
    return vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2


# Round trips per transaction of each workload with -M simple: the ceiling of a pooler
# that waits for each reply is pool / (round trips x round trip time).
ROUND_TRIPS = {"select": 1, "update": 1, "tpcb": 7}  # BEGIN, 3 UPDATEs, SELECT, INSERT, END
COLORS = {"direct": "#7f7f7f", "pgbouncer": "#1f77b4", "weir-nopipe": "#fdae6b",
          "weir": "#e6550d"}


def _esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _nice_max(v):
    e = 10 ** math.floor(math.log10(max(v, 1)))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * e >= v:
            return m * e
    return 10 * e


def write_pool_svg(path, rows, meta, rtts):
    """TPS against pool size, one panel per (workload, delay): each pooler target
    (PgBouncer, Weir with pipelining off and on) as a line, direct (pool size does not
    apply: one connection per client) as a dashed level, and, where a delay is set, the
    ceiling of a pooler that waits for each reply on each server connection: pool x 1000 /
    (round trips per transaction x measured SELECT 1 round trip in ms)."""
    wls = sorted({r["workload"] for r in rows}, key=["select", "update", "tpcb"].index)
    delays = sorted({r["delay_ms"] for r in rows})
    panels = [(wl, d) for wl in wls for d in delays]
    if not panels:
        return
    cols = len(delays)
    nrows = len(wls)
    pw, ph = 380, 270
    ml, mr, mt, mb = 62, 14, 34, 40
    # A long description goes on two lines, split at the "; " nearest the middle.
    metas = [meta]
    if len(meta) > 110 and "; " in meta:
        cut = min((i for i in range(len(meta)) if meta.startswith("; ", i)),
                  key=lambda i: abs(i - len(meta) / 2))
        metas = [meta[:cut + 1], meta[cut + 2:]]
    ly = 58 + 14 * (len(metas) - 1)  # the legend's line
    top = ly + 20
    W = max(cols * pw + 20, 860)
    H = top + nrows * ph + 20
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         f'viewBox="0 0 {W} {H}" font-family="Helvetica,Arial,sans-serif" font-size="11">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         '<text x="10" y="20" font-size="15" font-weight="bold">pgbench TPS vs pool size, '
         'with a network delay between pooler and PostgreSQL</text>',
         ] + [f'<text x="10" y="{38 + 14 * i}" fill="#555">{_esc(m)}</text>'
              for i, m in enumerate(metas)]
    lx = 10
    present = [t for t in ORDER if any(r["target"] == t for r in rows)]
    label = {"direct": "direct (1 conn/client)", "weir-nopipe": "weir, pipelining off",
             "weir": "weir" + (", pipelining on" if "weir-nopipe" in present else "")}
    for t in present:
        dash = ' stroke-dasharray="6,4"' if t == "direct" else ""
        o.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 22}" y2="{ly}" stroke="{COLORS[t]}" '
                 f'stroke-width="3"{dash}/><text x="{lx + 28}" y="{ly + 4}">'
                 f'{label.get(t, t)}</text>')
        lx += 40 + 6 * len(label.get(t, t))
    o.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 22}" y2="{ly}" stroke="#2ca02c" '
             f'stroke-width="1.5" stroke-dasharray="2,3"/><text x="{lx + 28}" y="{ly + 4}">'
             'ceiling without pipelining</text>')
    wname = {"select": "select-only (-S)", "update": "UPDATE by aid, autocommit",
             "tpcb": "tpcb-like"}
    for i, (wl, d) in enumerate(panels):
        gx = 10 + (i % cols) * pw
        gy = top + (i // cols) * ph
        px0, py0 = gx + ml, gy + mt
        pw_in, ph_in = pw - ml - mr, ph - mt - mb
        o.append(f'<text x="{gx + pw / 2}" y="{gy + 18}" text-anchor="middle" '
                 f'font-weight="bold">{_esc(f"{wname.get(wl, wl)}, {d} ms each way")}</text>')
        fr = [r for r in rows if r["workload"] == wl and r["delay_ms"] == d]
        xs = sorted({r["pool"] for r in fr if r["target"] != "direct"}) or \
            sorted({r["pool"] for r in fr})
        direct = [r for r in fr if r["target"] == "direct" and r["tps"] is not None]
        ymax = _nice_max(max([r["tps"] or 0 for r in fr] + [1]) * 1.05)
        lo, hi = math.log10(min(xs)), math.log10(max(xs))

        def X(c):
            if hi == lo:
                return px0 + pw_in / 2
            return px0 + 12 + (math.log10(c) - lo) / (hi - lo) * (pw_in - 24)

        def Y(v):
            return py0 + ph_in - min(v, ymax) / ymax * ph_in
        o.append(f'<rect x="{px0}" y="{py0}" width="{pw_in}" height="{ph_in}" fill="#fafafa" '
                 f'stroke="#bbb"/>')
        for k in range(6):
            v = ymax * k / 5
            o.append(f'<line x1="{px0}" y1="{Y(v):.1f}" x2="{px0 + pw_in}" y2="{Y(v):.1f}" '
                     f'stroke="#e3e3e3"/><text x="{px0 - 5}" y="{Y(v) + 4:.1f}" '
                     f'text-anchor="end" fill="#444">'
                     f'{f"{v / 1000:.1f}k" if ymax >= 2000 else f"{v:.0f}"}</text>')
        for c in xs:
            o.append(f'<text x="{X(c):.1f}" y="{py0 + ph_in + 15}" text-anchor="middle" '
                     f'fill="#444">{c}</text>')
        o.append(f'<text x="{px0 + pw_in / 2}" y="{py0 + ph_in + 31}" text-anchor="middle" '
                 f'fill="#444">pool size (server connections, log scale)</text>')
        o.append(f'<text transform="translate({gx + 14},{py0 + ph_in / 2}) rotate(-90)" '
                 f'text-anchor="middle" fill="#444">TPS</text>')
        if direct:
            y = Y(direct[0]["tps"])
            o.append(f'<line x1="{px0}" y1="{y:.1f}" x2="{px0 + pw_in}" y2="{y:.1f}" '
                     f'stroke="{COLORS["direct"]}" stroke-width="2" stroke-dasharray="6,4">'
                     f'<title>direct: {direct[0]["tps"]:.0f} TPS</title></line>')
        rtt = rtts.get(d)
        if d and rtt:
            # tpcb-like is seven statements, each its own round trip.
            n = ROUND_TRIPS.get(wl, 1)
            pts = " ".join(f"{X(c):.1f},{Y(c * 1000 / (n * rtt)):.1f}" for c in xs)
            o.append(f'<polyline points="{pts}" fill="none" stroke="#2ca02c" stroke-width="1.5" '
                     f'stroke-dasharray="2,3"><title>pool x 1000 / ({n} x {rtt:.2f} ms)'
                     '</title></polyline>')
        for t in (t for t in POOLER_ORDER if t in present):
            pts = sorted(((r["pool"], r["tps"], r["status"]) for r in fr if r["target"] == t),
                         key=lambda p: p[0])
            good = [(c, v) for c, v, st in pts if v is not None and st == "ok"]
            if len(good) > 1:
                o.append('<polyline points="' + " ".join(f"{X(c):.1f},{Y(v):.1f}"
                                                         for c, v in good)
                         + f'" fill="none" stroke="{COLORS[t]}" stroke-width="2.2"/>')
            for c, v, st in pts:
                if v is not None and st == "ok":
                    o.append(f'<circle cx="{X(c):.1f}" cy="{Y(v):.1f}" r="3.5" '
                             f'fill="{COLORS[t]}"><title>{t} pool {c}: {v:.0f} TPS</title>'
                             '</circle>')
                else:
                    y, x = (Y(v) if v else py0 + ph_in - 6), X(c)
                    o.append(f'<path d="M{x - 4:.1f},{y - 4:.1f}L{x + 4:.1f},{y + 4:.1f}'
                             f'M{x - 4:.1f},{y + 4:.1f}L{x + 4:.1f},{y - 4:.1f}" '
                             f'stroke="{COLORS[t]}" stroke-width="2"><title>{t} pool {c}: '
                             f'{_esc(st)}</title></path>')
    o.append("</svg>")
    Path(path).write_text("\n".join(o) + "\n")
