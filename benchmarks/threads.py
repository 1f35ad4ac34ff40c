"""Updates per second of the default `lucid train` (CartPole-v1, its CPU preset) for torch
thread settings, on an idle machine and beside a competing CPU-bound process.

    python benchmarks/threads.py [--seconds 45] [--settings 0,1,2,2p] [--out results/threads.json]

Each setting trains in its own `lucid train` process for `--seconds` of wall time after the
random prefill; the number is the median of `perf/updates_per_s` over its metric rows. The
competitor is one process spinning a Python loop (as a browser tab or a second run would
keep a core busy). `run.threads=0` is lucid's default; a setting ending in `p` runs with
OMP_WAIT_POLICY=PASSIVE (OpenMP's waiting threads sleep at once instead of spinning). Prints
a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _competitor() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _updates_per_s(threads: str, seconds: float, env: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        # run.time_limit counts from the start; the prefill (random steps) takes a few seconds
        cmd = [sys.executable, "-m", "lucid", "train", "CartPole-v1", "--run-dir", str(run),
               "--steps", "1000000", f"run.time_limit={(seconds + 10) / 60:.4f}",
               "run.log_every=2", "run.progress=false", "run.videos=false",
               "run.logger=none", f"run.threads={threads}"]
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
        wall = time.perf_counter() - t0
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    ups = sorted(r["perf/updates_per_s"] for r in rows
                 if r.get("updates", 0) > 0 and "perf/updates_per_s" in r)
    return {"threads": threads, "median_updates_per_s": ups[len(ups) // 2] if ups else 0.0,
            "rows": len(ups), "updates": rows[-1]["updates"] if rows else 0,
            "wall_s": round(wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=45.0)
    ap.add_argument("--settings", default="0,1,2,2p",
                    help="run.threads values, comma separated (2p: 2, OMP_WAIT_POLICY=PASSIVE)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "threads.json"))
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    results = {"cores": os.cpu_count(), "seconds": args.seconds, "rows": []}
    for load in ("idle", "one busy process"):
        for threads in args.settings.split(","):
            busy = _competitor() if load != "idle" else None
            passive = threads.endswith("p")
            try:
                r = _updates_per_s(threads.rstrip("p"), args.seconds,
                                   {**env, "OMP_WAIT_POLICY": "PASSIVE"} if passive else env)
                r["omp_wait_policy"] = "PASSIVE" if passive else "default"
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
            r["load"] = load
            results["rows"].append(r)
            print(f"{load:18s} run.threads={threads:3s}: {r['median_updates_per_s']:6.2f} "
                  f"updates/s ({r['updates']} updates, {r['rows']} rows)", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
