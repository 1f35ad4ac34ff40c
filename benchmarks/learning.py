"""Does it learn, and how fast? Runs `lucid train` per task and seed (one at a time) and
reports wall time and env steps until the mean return of the last 10 episodes reaches the
task's threshold.

    python benchmarks/learning.py                       # all tasks, 3 seeds
    python benchmarks/learning.py --tasks cartpole --seeds 0 1 2

Writes benchmarks/results/learning.json. Each run is a normal run directory under
--runs-dir, so curves can be inspected afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name: (env id, preset, threshold, minutes allowed, extra overrides)
TASKS = {
    "cartpole": ("CartPole-v1", "cpu-control", 450.0, 10.0, []),
    "pendulum": ("Pendulum-v1", "cpu-control", -250.0, 30.0, []),
    "minigrid": ("minigrid:Empty-5x5", "cpu-pixels", 0.85, 30.0, []),
    "walker": ("dmc:walker-walk", "cpu-control", 200.0, 45.0, []),
}


def time_to_threshold(run_dir: Path, threshold: float) -> dict:
    rows = [json.loads(line) for line in open(run_dir / "episodes.jsonl")]
    rows = [r for r in rows if not r.get("eval")]
    recent: list[float] = []
    for r in rows:
        recent = (recent + [r["return"]])[-10:]
        if len(recent) == 10 and statistics.mean(recent) >= threshold:
            return {"reached": True, "wall_time_s": r["wall_time"], "env_steps": r["env_steps"],
                    "episodes": len(rows)}
    last = statistics.mean(recent) if recent else None
    return {"reached": False, "final_mean_return_10": last, "episodes": len(rows),
            "env_steps": rows[-1]["env_steps"] if rows else 0}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--tasks", nargs="+", default=list(TASKS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--preset", help="every task's preset (default: the task's own)")
    p.add_argument("--runs-dir", default="runs/learning")
    p.add_argument("--json", default="benchmarks/results/learning.json")
    p.add_argument("overrides", nargs="*", help="extra section.key=value for every run "
                   "(after --, or before the options: --seeds would take them)")
    a = p.parse_args(argv)
    results = []
    for name in a.tasks:
        env, preset, threshold, minutes, extra = TASKS[name]
        preset = a.preset or preset
        for seed in a.seeds:
            run_dir = Path(a.runs_dir) / f"{name}-s{seed}-{time.strftime('%H%M%S')}"
            cmd = [sys.executable, "-m", "lucid", "train", env, "--preset", preset,
                   "--seed", str(seed), "--run-dir", str(run_dir), "--steps", "10000000",
                   f"run.time_limit={minutes}", f"run.target_return={threshold}",
                   "run.progress=false", *extra, *a.overrides]
            t0 = time.time()
            subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                           stdout=subprocess.DEVNULL)
            r = {"task": name, "env": env, "preset": preset, "seed": seed, "threshold": threshold,
                 "minutes_allowed": minutes, "run_dir": str(run_dir),
                 "process_wall_s": time.time() - t0, **time_to_threshold(ROOT / run_dir, threshold)}
            results.append(r)
            print(json.dumps(r), flush=True)
    out = ROOT / a.json
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"load_avg": os.getloadavg(), "results": results}, indent=1))
    for name in a.tasks:
        rs = [r for r in results if r["task"] == name]
        times = [r["wall_time_s"] if r["reached"] else float("inf") for r in rs]
        print(f"{name}: reached {sum(r['reached'] for r in rs)}/{len(rs)}; "
              f"median time to threshold {statistics.median(times):.0f} s")


if __name__ == "__main__":
    main()
