#!/usr/bin/env python3
"""bench/run --session-state (issue 27, "Session state without extra round trips"): what
a client's session state costs through a transaction pooler.

Clients (psycopg 3, one connection each, autocommit, psycopg's default prepare_threshold)
run `select current_setting('search_path')` in a loop for a fixed time through a pooler
with a small pool, in three variants:

    none    no session state: the connection as it logged in
    shared  every client SETs the same three settings at connect, as Active Record does
            (timezone, intervalstyle, client_min_messages)
    own     every client SETs its own search_path (tenant_<n>, public; no such schema
            exists, which PostgreSQL allows) and its own application_name at connect

Each client checks every answer: current_setting('search_path') must be its own
search_path (the server's default in none and shared). A pooler that hands a client a
server connection carrying another client's state answers wrongly; such a run is
reported as wrong answers, never as a rate.

This file is two things:
- imported by bench/run (Python standard library only): finding a Python with psycopg
  (installing it into a venv if needed), running the client processes, and the summary;
- run as a script by that Python: one client process (N client threads), driven over
  stdin/stdout by bench/run:
      stdin:  one JSON line (the spec), later "GO <t0> <t1>" (time.monotonic() values:
              measure from t0, stop at t1) or "STOP"
      stdout: "READY <json>" once every client has connected and SET its state (or
              failed), "DONE <json>" with the counts once the clients have stopped.
"""

import fcntl
import json
import os
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

QUERY = "select current_setting('search_path')"
VARIANTS = ("none", "shared", "own")
# What Active Record's PostgreSQL adapter sends at connect (configure_connection), one
# statement at a time: the same for every client.
SHARED_SETS = ("SET client_min_messages TO 'warning'",
               "SET intervalstyle = iso_8601",
               "SET SESSION timezone TO 'UTC'")
# psycopg 3, as tests/drivers/python/requirements.txt pins it for the driver tests.
PSYCOPG_SPEC = "psycopg[binary]>=3.1,<4"
# Issue 27's acceptance (Weir, same run): own >= 0.9 x none and shared >= 0.97 x none at
# 1 ms each way; own >= 0.9 x none with no delay.
ACCEPTANCE = [("own", 1, 0.90), ("shared", 1, 0.97), ("own", 0, 0.90)]


class SessionStateError(Exception):
    pass


def client_sets(variant, n):
    """The statements client n sends after logging in, one at a time."""
    if variant == "none":
        return []
    if variant == "shared":
        return list(SHARED_SETS)
    if variant == "own":
        return [f"SET search_path = tenant_{n}, public",
                f"SET application_name = 'tenant_{n}'"]
    raise ValueError(f"unknown variant {variant}")


def expected_search_path(variant, n, default):
    """What current_setting('search_path') must answer client n (PostgreSQL keeps a
    search_path SET as a list written with ', ')."""
    return f"tenant_{n}, public" if variant == "own" else default


# --------------------------------------------------------------------------
# a Python that has psycopg

def _imports_psycopg(python):
    try:
        r = subprocess.run([python, "-c", "import psycopg; print(psycopg.__version__, "
                            "psycopg.pq.__impl__)"], capture_output=True, text=True,
                           timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def find_python(allow_install, log):
    """(python, 'psycopg <version> <impl>'): an interpreter that imports psycopg 3. In
    order: the one running bench/run; the driver tests' venv (scripts/install-drivers:
    $WEIR_DRIVERS_DIR/venv, default ~/.cache/weir-drivers/venv; CI has it); bench's own
    venv, ~/.cache/weir-bench/venv, made here with `pip install "psycopg[binary]"` when
    none of them has it (unless allow_install is false)."""
    cache = Path.home() / ".cache"
    drivers = Path(os.environ.get("WEIR_DRIVERS_DIR") or cache / "weir-drivers")
    own = Path(os.environ.get("WEIR_BENCH_VENV") or cache / "weir-bench" / "venv")
    for python in (sys.executable, drivers / "venv" / "bin" / "python",
                   own / "bin" / "python"):
        if os.access(python, os.X_OK) and (v := _imports_psycopg(str(python))):
            return str(python), f"psycopg {v}"
    if not allow_install:
        raise SessionStateError(
            "psycopg 3 not found (tried this Python, the drivers' venv and "
            f"{own}) and --no-install: pip install \"{PSYCOPG_SPEC}\" first")
    own.parent.mkdir(parents=True, exist_ok=True)
    with open(own.parent / ".lock", "w") as lock:
        # Two bench runs at once must not build the same venv together.
        fcntl.flock(lock, fcntl.LOCK_EX)
        python = own / "bin" / "python"
        if not os.access(python, os.X_OK):
            log(f"making a venv for psycopg: {own}")
            r = subprocess.run([sys.executable, "-m", "venv", str(own)], capture_output=True,
                               text=True)
            if r.returncode != 0:
                raise SessionStateError(
                    f"python3 -m venv {own} failed (python3-venv missing?):\n"
                    f"{(r.stdout + r.stderr)[-1500:]}")
        if not (v := _imports_psycopg(str(python))):
            log(f"pip install \"{PSYCOPG_SPEC}\" into {own}")
            r = subprocess.run([str(python), "-m", "pip", "install", "-q",
                                "--disable-pip-version-check", PSYCOPG_SPEC],
                               capture_output=True, text=True)
            v = _imports_psycopg(str(python))
            if r.returncode != 0 or not v:
                raise SessionStateError(f"pip install \"{PSYCOPG_SPEC}\" failed:\n"
                                        f"{(r.stdout + r.stderr)[-2000:]}")
    return str(python), f"psycopg {v}"


# --------------------------------------------------------------------------
# bench/run's side: one measured run

def _readline(p, deadline):
    """One line from a client process's stdout, or None at EOF or the deadline."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([p.stdout], [], [], min(left, 1.0))
        if ready:
            line = p.stdout.readline()
            return line if line else None
        if p.poll() is not None:
            return None


def _percentile(sorted_vals, q):
    if not sorted_vals:
        return None
    k = max(0, -(-len(sorted_vals) * q // 100) - 1)
    return sorted_vals[int(k)]


def run_clients(python, conninfo, variant, n_clients, procs, duration, warmup,
                default_search_path, prepare_threshold, on_spawn, on_exit, on_window=None,
                setup_timeout=120.0):
    """Starts `procs` client processes holding `n_clients` clients in all, waits until
    each client has logged in and SET its state, lets them loop for warmup + duration
    seconds and counts the answers of the last `duration` seconds. Returns a dict:
    qps (right answers per second in the window), queries, wrong and errors (whole run,
    warm-up included), wrong_window, connected, failed, p50_ms/p99_ms (right answers in
    the window), client_cpu_s, first_error, wrong_sample, window_s; and t0/t1, the
    window (time.monotonic()), also given to on_window(t0, t1) as soon as it is set (the
    caller's CPU accounting)."""
    procs = max(1, min(procs, n_clients))
    ids = list(range(1, n_clients + 1))
    groups = [ids[i::procs] for i in range(procs)]
    spec_base = {"conninfo": conninfo, "query": QUERY, "prepare_threshold": prepare_threshold}
    children = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    try:
        for group in groups:
            p = subprocess.Popen([python, str(HERE / "session_state.py")],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env=env, start_new_session=True)
            on_spawn(p)
            children.append(p)
            spec = dict(spec_base, clients=[
                {"id": n, "sets": client_sets(variant, n),
                 "expect": expected_search_path(variant, n, default_search_path)}
                for n in group])
            p.stdin.write(json.dumps(spec) + "\n")
            p.stdin.flush()
        deadline = time.monotonic() + setup_timeout
        connected = failed = 0
        first_error = ""
        for p in children:
            line = _readline(p, deadline)
            if not line or not line.startswith("READY "):
                raise SessionStateError(f"a client process did not get ready "
                                        f"(rc {p.poll()}): {line!r}")
            r = json.loads(line[6:])
            connected += r["connected"]
            failed += r["failed"]
            first_error = first_error or r["first_error"]
        if failed:
            for p in children:
                p.stdin.write("STOP\n")
                p.stdin.flush()
            return {"connected": connected, "failed": failed, "first_error": first_error,
                    "qps": None, "queries": 0, "wrong": 0, "wrong_window": 0, "errors": 0}
        t0 = time.monotonic() + 0.2 + warmup  # 0.2 s: every process reads GO before
        t1 = t0 + duration
        for p in children:
            p.stdin.write(f"GO {time.monotonic() + 0.2!r} {t0!r} {t1!r}\n")
            p.stdin.flush()
        if on_window:
            on_window(t0, t1)
        deadline = t1 + 60.0
        done = []
        for p in children:
            line = _readline(p, deadline)
            if not line or not line.startswith("DONE "):
                raise SessionStateError(f"a client process did not finish "
                                        f"(rc {p.poll()}): {line!r}")
            done.append(json.loads(line[5:]))
    finally:
        for p in children:
            try:
                p.stdin.close()
            except OSError:
                pass
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            on_exit(p)
    lats = sorted(x for d in done for x in d["lat_us"])
    res = {"connected": connected, "failed": failed, "window_s": duration, "t0": t0, "t1": t1,
           "queries": sum(d["ok_window"] for d in done),
           "queries_total": sum(d["ok"] for d in done),
           "wrong": sum(d["wrong"] for d in done),
           "wrong_window": sum(d["wrong_window"] for d in done),
           "errors": sum(d["errors"] for d in done),
           "clients_stopped": sum(d["stopped"] for d in done),
           "client_cpu_s": round(sum(d["cpu_s"] for d in done), 3),
           "first_error": next((d["first_error"] for d in done if d["first_error"]), ""),
           "wrong_sample": [s for d in done for s in d["wrong_sample"]][:3],
           "p50_ms": None, "p99_ms": None}
    res["qps"] = round(res["queries"] / duration, 1)
    if lats:
        res["p50_ms"] = round(_percentile(lats, 50) / 1000, 3)
        res["p99_ms"] = round(_percentile(lats, 99) / 1000, 3)
    return res


def run_status(r, pooler_alive=True):
    """ok, wrong-answers, errors, failed (clients could not log in or SET, or none
    answered) or pooler-died."""
    if not pooler_alive:
        return "pooler-died"
    if r.get("failed") or r.get("qps") is None:
        return "failed"
    if r.get("wrong"):
        return "wrong-answers"
    if r.get("errors") or r.get("clients_stopped") or not r.get("queries"):
        return "errors"
    return "ok"


# --------------------------------------------------------------------------
# the summary

def _median(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def summarize(runs):
    """Per (delay, target, variant): the runs' statuses, the median q/s of the ok runs,
    answers wrong of all answers; per (delay, target): own/none and shared/none of those
    medians and of each round (the same round's runs, back to back)."""
    cells = {}
    for r in runs:
        c = cells.setdefault((r["delay_ms"], r["target"], r["variant"]), {"runs": []})
        c["runs"].append(r)
    for c in cells.values():
        rs = c["runs"]
        statuses = sorted({r["status"] for r in rs})
        c["status"] = statuses[0] if len(statuses) == 1 else "/".join(statuses)
        ok = [r for r in rs if r["status"] == "ok"]
        c["qps"] = _median([r["qps"] for r in ok]) if len(ok) == len(rs) else None
        c["qps_range"] = (min(r["qps"] for r in ok), max(r["qps"] for r in ok)) if ok else None
        c["p99_ms"] = _median([r.get("p99_ms") for r in ok])
        c["pooler_cpu_s_per_1k"] = _median([r.get("pooler_cpu_s_per_1k") for r in ok])
        c["wrong"] = sum(r.get("wrong", 0) for r in rs)
        c["answers"] = sum(r.get("wrong", 0) + r.get("queries_total", 0) for r in rs)
        c["errors"] = sum(r.get("errors", 0) for r in rs)
        c["first_error"] = next((r.get("first_error") for r in rs if r.get("first_error")), "")
        c["wrong_sample"] = next((r["wrong_sample"] for r in rs if r.get("wrong_sample")), [])
    ratios = {}
    for (d, t, v), c in cells.items():
        if v not in ("shared", "own"):
            continue
        base = cells.get((d, t, "none"))
        rounds = []
        for r in c["runs"]:
            b = next((x for x in (base or {}).get("runs", [])
                      if x["rep"] == r["rep"] and x["status"] == "ok"), None)
            if r["status"] == "ok" and b and b["qps"]:
                rounds.append(round(r["qps"] / b["qps"], 3))
        ratio = (round(c["qps"] / base["qps"], 3)
                 if base and c["qps"] and base["qps"] else None)
        ratios[(d, t, v)] = {"ratio": ratio, "rounds": rounds}
    return cells, ratios


def _fmt_delay(d):
    return f"{d:g} ms"


def print_summary(runs, meta, out, acceptance=True):
    """The table (q/s per variant, per delay and target; shared/none and own/none), what
    the wrong answers were, and (acceptance) issue 27's acceptance figures for each Weir
    target. Returns the text."""
    cells, ratios = summarize(runs)
    delays = list(dict.fromkeys(r["delay_ms"] for r in runs))
    targets = list(dict.fromkeys(r["target"] for r in runs))
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in runs)]
    reps = max((r["rep"] for r in runs), default=0) + 1
    lines = [
        f"Session state (issue 27): {meta['clients']} psycopg clients "
        f"({meta['client_processes']} process{'es' if meta['client_processes'] > 1 else ''}, "
        f"{meta['psycopg']}), "
        f"pool {meta['pool_size']}, transaction mode,",
        f"each running {QUERY} in a loop and checking every answer; "
        f"queries/s over {meta['duration_s']} s after {meta['warmup_s']:g} s of warm-up"
        + (f", median of {reps} rounds" if reps > 1 else "") + ".",
        "", f"{'delay':<8} {'target':<12}" + "".join(f"{v:>13}" for v in variants)
        + "".join(f"{v + '/none':>13}" for v in variants if v != "none")
        + f"{'p99 ms (' + '/'.join(variants) + ')':>26}"
        + f"{'pooler µs CPU/q':>18}"]
    lines.append("-" * len(lines[-1]))
    notes = []
    for d in delays:
        for t in targets:
            row = f"{_fmt_delay(d):<8} {t:<12}"
            p99 = []
            for v in variants:
                c = cells.get((d, t, v))
                if c is None:
                    cell = "-"
                elif c["status"] == "ok":
                    cell = f"{c['qps']:,.0f}"
                elif c["wrong"]:
                    cell = f"WRONG {c['wrong'] / max(1, c['answers']):.0%}"
                    ex = c["wrong_sample"][0] if c["wrong_sample"] else None
                    notes.append(
                        f"{t}, {v}, {_fmt_delay(d)}: wrong answers: {c['wrong']:,} of "
                        f"{c['answers']:,}"
                        + (f" (e.g. client {ex['client']} expected {ex['expected']!r}, "
                           f"got {ex['got']!r})" if ex else ""))
                else:
                    cell = c["status"]
                    notes.append(f"{t}, {v}, {_fmt_delay(d)}: {c['status']}: "
                                 f"{c['errors']} errors; {c['first_error'][:200]}")
                row += f"{cell:>13}"
                p99.append(fmt_num(c and c["status"] == "ok" and c["p99_ms"], ".2f"))
            for v in variants:
                if v == "none":
                    continue
                rt = ratios.get((d, t, v))
                row += f"{fmt_num(rt and rt['ratio'], '.2f'):>13}"
            row += f"{' / '.join(p99):>26}"
            cpu = [c and c["status"] == "ok" and c["pooler_cpu_s_per_1k"] for c in
                   (cells.get((d, t, v)) for v in variants)]
            row += f"{' / '.join(fmt_num(x and x * 1000, '.0f') for x in cpu):>18}"
            lines.append(row)
        lines.append("")
    if reps > 1:
        lines.append("Per-round ratios (each round's variants back to back):")
        for (d, t, v), rt in ratios.items():
            if rt["rounds"]:
                lines.append(f"  {_fmt_delay(d):<7} {t:<12} {v}/none: "
                             + ", ".join(f"{x:.2f}" for x in rt["rounds"]))
        lines.append("")
    lines += notes + ([""] if notes else [])
    for t in targets:
        if not acceptance or not t.startswith("weir"):
            continue
        checks = []
        for v, d, want in ACCEPTANCE:
            if d not in delays or v not in variants or "none" not in variants:
                continue
            rt = (ratios.get((d, t, v)) or {}).get("ratio")
            verdict = "-" if rt is None else ("yes" if rt >= want else "no")
            checks.append(f"{v}/none at {_fmt_delay(d)} {fmt_num(rt, '.2f')} "
                          f"(>= {want:.2f}: {verdict})")
        if checks:
            lines.append(f"Issue 27's acceptance, {t}: " + "; ".join(checks))
    lines.append("WRONG n%: the share of answers that were another client's search_path "
                 "(a pooler that gives wrong answers has no rate). pooler µs CPU/q: the "
                 "pooler process's user+sys CPU per right answer in the window (median).")
    text = "\n".join(lines) + "\n"
    out.write(text)
    return text


def fmt_num(v, spec):
    return "-" if v is None or v is False else format(v, spec)


# --------------------------------------------------------------------------
# the client process (run by a Python that has psycopg)

def _client_process():
    import threading

    import psycopg

    spec = json.loads(sys.stdin.readline())
    clients = spec["clients"]
    query = spec["query"]
    barrier = threading.Barrier(len(clients) + 1)
    go = threading.Event()
    window = {}
    results = [None] * len(clients)

    def client(i, c):
        r = {"ok": 0, "ok_window": 0, "wrong": 0, "wrong_window": 0, "errors": 0,
             "stopped": 0, "setup_error": "", "first_error": "", "wrong_sample": [],
             "lat_us": []}
        results[i] = r
        conn = None
        try:
            conn = psycopg.connect(**spec["conninfo"], autocommit=True,
                                   prepare_threshold=spec["prepare_threshold"])
            for sql in c["sets"]:
                conn.execute(sql)
        except Exception as e:  # noqa: BLE001 (reported, not raised)
            r["setup_error"] = f"{type(e).__name__}: {e}".strip()
        barrier.wait()
        go.wait()
        if conn is None or r["setup_error"]:
            return
        t0, t1 = window["t0"], window["t1"]
        expect = c["expect"]
        cur = conn.cursor()
        errors_in_a_row = 0
        lat = r["lat_us"]
        mono = time.monotonic
        now = mono()
        while now < t1:
            start = now
            try:
                cur.execute(query)
                got = cur.fetchone()[0]
            except psycopg.Error as e:
                now = mono()
                r["errors"] += 1
                r["first_error"] = r["first_error"] or f"{type(e).__name__}: {e}".strip()
                errors_in_a_row += 1
                if conn.closed or errors_in_a_row >= 20:
                    r["stopped"] = 1
                    break
                continue
            errors_in_a_row = 0
            now = mono()
            inside = t0 <= now <= t1
            if got == expect:
                r["ok"] += 1
                if inside:
                    r["ok_window"] += 1
                    lat.append(round((now - start) * 1e6))
            else:
                r["wrong"] += 1
                r["wrong_window"] += inside
                if len(r["wrong_sample"]) < 1:
                    r["wrong_sample"].append({"client": c["id"], "expected": expect,
                                              "got": got})
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass

    threads = [threading.Thread(target=client, args=(i, c), daemon=True)
               for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    failed = [r for r in results if r["setup_error"]]
    print("READY " + json.dumps({"connected": len(clients) - len(failed),
                                 "failed": len(failed),
                                 "first_error": failed[0]["setup_error"] if failed else ""}),
          flush=True)
    line = sys.stdin.readline().split()
    if line[:1] == ["GO"]:
        start_at, window["t0"], window["t1"] = (float(x) for x in line[1:4])
        time.sleep(max(0.0, start_at - time.monotonic()))
    else:
        window["t0"] = window["t1"] = 0.0
    cpu0 = time.process_time()
    go.set()
    for t in threads:
        t.join()
    cpu = time.process_time() - cpu0
    out = {k: sum(r[k] for r in results)
           for k in ("ok", "ok_window", "wrong", "wrong_window", "errors", "stopped")}
    out["cpu_s"] = round(cpu, 3)
    out["first_error"] = next((r["first_error"] for r in results if r["first_error"]), "")
    out["wrong_sample"] = [s for r in results for s in r["wrong_sample"]][:3]
    out["lat_us"] = [x for r in results for x in r["lat_us"]]
    print("DONE " + json.dumps(out), flush=True)


if __name__ == "__main__":
    _client_process()
