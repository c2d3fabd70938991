"""Profile-guided build of Weir, for bench/run and scripts/build-pgo.

Three steps: build an instrumented binary (profile `dist`: fat LTO, one codegen unit),
run it under a training workload that the caller supplies (bench/run drives pgbench
through it against its scratch PostgreSQL), then build again with the merged profile.
The profile only steers the compiler's layout and inlining: behaviour is the same code.

The instrumented build is cached in target/pgo-generate (its flags never change). The
optimized one, in target/pgo, is made from scratch each time: no two trainings give the
same profile, cargo does not notice a changed profile file behind unchanged flags, and
keeping the artifacts of every past profile would grow the directory by ~400 MB a run.

Python standard library only.
"""

import os
import shutil
import subprocess
from pathlib import Path


class PgoError(Exception):
    pass


def cargo():
    """Cargo, on PATH or where rustup puts it."""
    return shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")


def _rustc_host_and_sysroot():
    rustc = shutil.which("rustc") or str(Path.home() / ".cargo" / "bin" / "rustc")
    vv = subprocess.run([rustc, "-vV"], capture_output=True, text=True, check=True).stdout
    host = next(line.split(": ", 1)[1] for line in vv.splitlines() if line.startswith("host: "))
    sysroot = subprocess.run([rustc, "--print", "sysroot"], capture_output=True, text=True,
                             check=True).stdout.strip()
    return host, Path(sysroot)


def llvm_profdata(log):
    """The llvm-profdata of the active toolchain (its LLVM must match rustc's, so a system
    one will not do), installing rustup's llvm-tools component if it is missing."""
    try:
        host, sysroot = _rustc_host_and_sysroot()
    except (OSError, subprocess.CalledProcessError, StopIteration) as e:
        raise PgoError(f"cannot ask rustc for its sysroot: {e}")
    tool = sysroot / "lib" / "rustlib" / host / "bin" / "llvm-profdata"
    if tool.exists():
        return tool
    rustup = shutil.which("rustup") or str(Path.home() / ".cargo" / "bin" / "rustup")
    log("installing rustup component llvm-tools (for llvm-profdata)")
    r = subprocess.run([rustup, "component", "add", "llvm-tools"], capture_output=True,
                       text=True)
    if r.returncode != 0 or not tool.exists():
        raise PgoError(f"llvm-profdata not available ({tool}): {r.stderr.strip()[-500:]}")
    return tool


def _build(repo, target_dir, rustflags, log, what):
    env = dict(os.environ)
    # RUSTFLAGS replaces any configured flags; the profile flags are all these builds need.
    env["RUSTFLAGS"] = rustflags
    env.pop("CARGO_ENCODED_RUSTFLAGS", None)
    log(f"building weir ({what})")
    r = subprocess.run([cargo(), "build", "--profile", "dist", "--bin", "weir", "--quiet",
                        "--target-dir", str(target_dir)], cwd=repo, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise PgoError(f"cargo build ({what}) failed:\n{r.stderr[-4000:]}")
    binary = Path(target_dir) / "dist" / "weir"
    if not binary.exists():
        raise PgoError(f"cargo build ({what}) left no binary at {binary}")
    return binary


def build(repo, workdir, train, log):
    """Builds target/pgo/dist/weir and returns its path.

    `workdir`: a scratch directory the trained process can write to (its profile files).
    `train(binary, env)`: runs the instrumented binary with `env` added to its environment
    under a workload, and stops it (cleanly, so that it writes its profile)."""
    repo = Path(repo)
    profdata = llvm_profdata(log)
    raw_dir = Path(workdir) / "pgo-raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(raw_dir, 0o777)
    # The directory given here is only the default: LLVM_PROFILE_FILE names the files.
    instrumented = _build(repo, repo / "target" / "pgo-generate",
                          f"-Cprofile-generate={repo / 'target' / 'pgo-generate' / 'raw'}",
                          log, "instrumented for profiling")
    for old in raw_dir.glob("*.profraw"):
        old.unlink()
    train(instrumented, {"LLVM_PROFILE_FILE": str(raw_dir / "weir-%p-%m.profraw")})
    raws = sorted(raw_dir.glob("weir-*.profraw"))
    if not raws:
        raise PgoError("the instrumented weir wrote no profile (did it exit cleanly?)")
    merged = Path(workdir) / "weir.profdata"
    r = subprocess.run([str(profdata), "merge", "-o", str(merged)] + [str(p) for p in raws],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise PgoError(f"llvm-profdata merge failed: {r.stderr.strip()[-2000:]}")
    out = repo / "target" / "pgo"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    kept = out / "weir.profdata"
    shutil.copyfile(merged, kept)
    return _build(repo, out, f"-Cprofile-use={kept}", log, "optimized with the profile")
