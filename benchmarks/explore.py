"""Exploration on a sparse-reward room (examples/sparse_room.py): state coverage and whether
the reward is found, for Plan2Explore (`explore.method=p2e`), the paper's agent and random
actions, over the same env steps and seeds.

    python benchmarks/explore.py [--steps 20000] [--seeds 0,1,2] [--methods p2e,none,random]
        [--size 31] [--max-steps 100] [--reward-free 0] [--then explore] [--threads 2]
        [--eval-every 2500] [--keep DIR] [--out benchmarks/results/explore.json]
        [-- KEY=VALUE ...]

Coverage is the number of distinct cells the run's env visited (its `cells_seen`, the random
prefill included): at the end, at the end of the reward-free phase (`cells_free`, p2e with
--reward-free) and every 2,500 env steps (`cells_at`). The agents train with the cpu-control
preset; every --eval-every env steps and after training the task policy (greedy) plays
evaluation episodes (`eval_curve`, `eval_return`). Also reported: the env step of the first
rewarded episode and the mean return of the last 10 training episodes. Prints a table and
writes JSON. Runs go one after another (`--threads` torch threads each); --keep keeps each
agent's run directory (DIR/METHOD-SEED).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.sparse_room import SparseRoom  # noqa: E402
from lucid.config import make_config  # noqa: E402
from lucid.train import Trainer  # noqa: E402

ENV = f"{ROOT / 'examples' / 'sparse_room.py'}:SparseRoom"


EVERY = 2500  # env steps between the coverage counts of `cells_at`


class Seen:
    """What the episodes showed: coverage over time, the first reward, the returns."""

    def __init__(self, reward_free: int):
        self.reward_free, self.cells, self.cells_free = reward_free, 0, None
        self.first, self.returns, self.cells_at = None, [], {}

    def episode(self, env_steps: int, ret: float, cells: int) -> None:
        for mark in range(len(self.cells_at) * EVERY, env_steps + 1, EVERY):
            self.cells_at[str(mark)] = self.cells  # the count when `mark` steps were done
        self.cells = cells
        if env_steps <= self.reward_free:
            self.cells_free = cells
        self.returns.append([env_steps, ret])
        if ret > 0 and self.first is None:
            self.first = env_steps

    def row(self) -> dict:
        return {"cells": self.cells, "cells_free": self.cells_free, "cells_at": self.cells_at,
                "first_reward_step": self.first,
                "recent_return": float(np.mean([r for _, r in self.returns[-10:]])),
                "returns": self.returns}


def random_run(seed: int, steps: int, size: int, max_steps: int, reward_free: int) -> dict:
    env, rng = SparseRoom(size, max_steps), np.random.default_rng(seed)
    env.reset(seed=seed)
    seen, ret = Seen(reward_free), 0.0
    for i in range(steps):
        _, r, term, trunc, info = env.step(int(rng.integers(4)))
        ret += r
        if term or trunc:
            seen.episode(i + 1, ret, info["cells_seen"])
            ret = 0.0
            env.reset()
    return {**seen.row(), "eval_return": None}


def eval_curve(run_dir: Path) -> dict[str, float]:
    """The greedy task policy's mean return at each periodic evaluation."""
    rows = [json.loads(line) for line in (run_dir / "episodes.jsonl").open()]
    by_step: dict[str, list] = {}
    for r in rows:
        if r.get("eval") and r.get("policy") == "greedy":
            by_step.setdefault(str(r["env_steps"]), []).append(r["return"])
    return {k: float(np.mean(v)) for k, v in by_step.items()}


def agent_run(method: str, seed: int, steps: int, size: int, max_steps: int,
              reward_free: int, then: str, threads: int, eval_every: int, keep: str | None,
              extra: list[str]) -> dict:
    seen = Seen(reward_free if method == "p2e" else 0)

    def on_episode(info: dict) -> None:
        seen.episode(info["env_steps"], info["return"], info["info"]["cells_seen"])

    overrides = [f"env.id={ENV}", f"env.kwargs.size={size}",
                 f"env.kwargs.max_steps={max_steps}", f"run.steps={steps}",
                 f"run.seed={seed}", f"run.threads={threads}", "run.logger=none",
                 "run.videos=false", "run.progress=false", f"explore.method={method}",
                 f"run.eval_every={eval_every}"]
    if method == "p2e" and reward_free:
        overrides += [f"explore.reward_free_steps={reward_free}", f"explore.then={then}"]
    cfg = make_config("cpu-control", overrides=overrides + extra)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(keep) / f"{method}-{seed}" if keep else Path(tmp) / "run"
        t0 = time.perf_counter()
        trainer = Trainer(cfg, run_dir)
        try:
            trainer.run(callback=on_episode)
            evals = trainer.evaluate(10)
        finally:
            trainer.close()
        curve = eval_curve(run_dir)
    return {**seen.row(), "eval_return": float(np.mean([e.ret for e in evals])),
            "eval_curve": curve, "wall_s": round(time.perf_counter() - t0, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--methods", default="p2e,none,random")
    p.add_argument("--size", type=int, default=31)
    p.add_argument("--max-steps", type=int, default=100)
    p.add_argument("--reward-free", type=int, default=0,
                   help="p2e: env steps of the reward-free phase")
    p.add_argument("--then", default="explore", choices=("explore", "task"),
                   help="p2e: who acts after the reward-free phase")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-every", type=int, default=2500)
    p.add_argument("--keep", default=None, help="keep the agents' run directories here")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "explore.json"))
    p.add_argument("extra", nargs="*", help="config overrides for the agents")
    a = p.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    rows = []
    for method in a.methods.split(","):
        for seed in seeds:
            if method == "random":
                r = random_run(seed, a.steps, a.size, a.max_steps, a.reward_free)
            else:
                r = agent_run(method, seed, a.steps, a.size, a.max_steps, a.reward_free,
                              a.then, a.threads, a.eval_every, a.keep, a.extra)
            rows.append({"method": method, "seed": seed, **r})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{a.size}x{a.size} room, {a.max_steps}-step episodes, {a.steps:,} env steps")
    free = f"cells@{a.reward_free}"
    print(f"{'method':8} {'seed':>4} {free:>12} {'cells':>6} {'first reward':>13} "
          f"{'last 10':>8} {'eval':>6}")
    for r in rows:
        ev = "" if r["eval_return"] is None else f"{r['eval_return']:.2f}"
        print(f"{r['method']:8} {r['seed']:>4} {str(r['cells_free'] or '-'):>12} "
              f"{r['cells']:>6} {str(r['first_reward_step'] or '-'):>13} "
              f"{r['recent_return']:>8.2f} {ev:>6}")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"size": a.size, "max_steps": a.max_steps, "steps": a.steps,
                               "reward_free": a.reward_free, "then": a.then,
                               "extra": a.extra,
                               "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
