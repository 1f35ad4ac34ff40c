"""Run the test suite as N plain pytest processes at once, each over its own share of the test
files, one thread each (OMP/MKL threads set before torch loads; two processes of two threads
on a 2-core machine would spin and wait on each other). `make test` runs it; `TEST_SHARDS=1`
runs one ordinary pytest process instead.

Shares are balanced by the seconds each file took in a measured run (tests/durations.json, the
sum of its tests' setup, call and teardown times; a file not listed there counts 2 s per test
function): the files go, slowest first, to the share with the least time so far. Each process
writes to a log of its own, printed whole when it ends; a process still running after
`--timeout` seconds is killed with its children and its log so far printed, so that a hang
fails the run instead of holding it. Plain processes rather than pytest-xdist workers: the one
xdist run on the CI machine hung with no test failed, for a cause never found (a suspect: an
xdist worker talks to its controller over a pipe, which a process that outlives a test can
hold open); each share here is an ordinary pytest run, as CI ran the suite before.

    python tests/shards.py [-n 2] [--timeout S] [--measure] [-- pytest args]

`--measure` writes the per-file seconds of this run to tests/durations.json."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
DURATIONS = TESTS / "durations.json"


def file_seconds(files: list[Path]) -> dict[str, float]:
    """Each file's measured seconds, or 2 s per test function for a file without a measure."""
    measured = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    return {f.name: measured.get(f.name, 2.0 * len(re.findall(r"^def test_", f.read_text(),
                                                                re.M)))
            for f in files}


def split(seconds: dict[str, float], n: int) -> list[list[str]]:
    """`n` shares of the files, each file (slowest first) to the share with the least time."""
    shares: list[list[str]] = [[] for _ in range(n)]
    load = [0.0] * n
    for name in sorted(seconds, key=lambda k: (-seconds[k], k)):
        i = load.index(min(load))
        shares[i].append(name)
        load[i] += seconds[name]
    return [s for s in shares if s]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=2, help="pytest processes at once")
    parser.add_argument("--timeout", type=float, default=2700,
                        help="seconds before a process still running is killed")
    parser.add_argument("--measure", action="store_true",
                        help="write the per-file seconds of this run to tests/durations.json")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER,
                        help="passed on to each pytest process (after --)")
    args = parser.parse_args(argv)
    extra = [a for a in args.pytest_args if a != "--"]
    files = sorted(TESTS.glob("test_*.py"))
    shares = split(file_seconds(files), max(1, args.n))
    logs = Path(tempfile.mkdtemp(prefix="lucid-tests-"))
    procs = []
    for i, share in enumerate(shares):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "LUCID_TEST_DURATIONS": str(logs / f"durations-{i}.json")}
        log = open(logs / f"share-{i}.log", "w")
        cmd = [sys.executable, "-m", "pytest", "-q", "-o", f"cache_dir=.pytest_cache/share-{i}",
               *extra, *(str(TESTS / f) for f in share)]
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                       cwd=TESTS.parent, start_new_session=True), log))
        print(f"share {i}: {len(share)} files: {' '.join(share)}", flush=True)
    start = time.monotonic()
    codes: list[int | None] = [None] * len(procs)
    while None in codes:
        time.sleep(1)
        for i, (proc, log) in enumerate(procs):
            if codes[i] is not None:
                continue
            if proc.poll() is None and time.monotonic() - start < args.timeout:
                continue
            if proc.poll() is None:  # past the timeout: the share and all it started
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                print(f"\nshare {i} was still running after {args.timeout:.0f} s: killed")
            codes[i] = proc.returncode
            log.close()
            print(f"\n===== share {i} (exit {codes[i]}, {time.monotonic() - start:.0f} s) =====",
                  flush=True)
            print((logs / f"share-{i}.log").read_text(), flush=True)
    for proc, _ in procs:  # what a share left running (a daemon in its process group)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if args.measure:
        seconds: dict[str, float] = {}
        for f in logs.glob("durations-*.json"):
            seconds.update(json.loads(f.read_text()))
        DURATIONS.write_text(json.dumps(dict(sorted(seconds.items())), indent=1) + "\n")
    print(f"{len(procs)} shares in {time.monotonic() - start:.0f} s; exit codes {codes}")
    if all(c in (0, 5) for c in codes) and 0 in codes:  # 5: a share whose tests -k left out
        return 0
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main())
