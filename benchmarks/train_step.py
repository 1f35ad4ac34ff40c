"""Milliseconds per agent update (world model + actor + critic) on synthetic batches.

    python benchmarks/train_step.py --size mini XS --obs vector image --action discrete
    python benchmarks/train_step.py --size XS --batch 16 --length 64 --iters 10 --json out.json

Prints a table (median / min / max ms per update, updates/s, replayed steps/s, peak RSS or
CUDA memory) and writes JSON with the machine's description. Numbers, not asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lucid.agent import Agent  # noqa: E402
from lucid.config import make_config  # noqa: E402
from lucid.envs.spaces import ActionSpec, ObsSpec  # noqa: E402


def machine() -> dict:
    return {
        "platform": platform.platform(), "python": platform.python_version(),
        "torch": torch.__version__, "numpy": np.__version__, "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "load_avg": os.getloadavg(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def spaces(obs: str, action: str):
    obs_space = (gym.spaces.Box(-1, 1, (4,)) if obs == "vector"
                 else gym.spaces.Box(0, 255, (64, 64, 3), np.uint8))
    act_space = gym.spaces.Discrete(6) if action == "discrete" else gym.spaces.Box(-1, 1, (6,))
    return ObsSpec.from_space(obs_space), ActionSpec.from_space(act_space)


def batch_for(obs_spec: ObsSpec, act_spec: ActionSpec, B: int, T: int, device) -> dict:
    g = torch.Generator().manual_seed(0)
    obs = {}
    for k, shape in obs_spec.images.items():
        obs[k] = torch.randint(0, 256, (B, T, *shape), generator=g, dtype=torch.uint8)
    for k, n in obs_spec.vectors.items():
        obs[k] = torch.randn(B, T, n, generator=g)
    if act_spec.is_discrete:
        action = torch.nn.functional.one_hot(torch.randint(0, act_spec.dim, (B, T), generator=g),
                                             act_spec.dim).float()
    else:
        action = torch.rand(B, T, act_spec.dim, generator=g) * 2 - 1
    batch = {"obs": obs, "action": action, "reward": torch.randn(B, T, generator=g),
             "is_first": torch.rand(B, T, generator=g) < 0.01,
             "is_terminal": torch.rand(B, T, generator=g) < 0.01}
    move = lambda x: x.to(device)  # noqa: E731
    batch["obs"] = {k: move(v) for k, v in batch["obs"].items()}
    return {k: (v if k == "obs" else move(v)) for k, v in batch.items()}


def peak_memory_mb(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench(size, obs, action, B, T, iters, warmup, device) -> dict:
    cfg = make_config("default", model={"size": size},
                      train={"batch_size": B, "batch_length": T})
    obs_spec, act_spec = spaces(obs, action)
    torch.manual_seed(0)
    agent = Agent(obs_spec, act_spec, cfg, device)
    batch = batch_for(obs_spec, act_spec, B, T, device)
    times = []
    for i in range(warmup + iters):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        agent.train_step(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"size": size, "obs": obs, "action": action, "B": B, "T": T,
            "horizon": cfg.train.horizon, "device": str(device),
            "ms_median": 1e3 * med, "ms_min": 1e3 * min(times), "ms_max": 1e3 * max(times),
            "updates_per_s": 1 / med, "replayed_steps_per_s": B * T / med,
            "peak_mem_mb": peak_memory_mb(device), "params": agent.num_params(),
            "iters": iters}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", nargs="+", default=["mini", "XS"])
    p.add_argument("--obs", nargs="+", default=["vector"], choices=["vector", "image"])
    p.add_argument("--action", nargs="+", default=["discrete"], choices=["discrete", "continuous"])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--json", default="benchmarks/results/train_step.json")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    rows = []
    print(f"{'size':>5} {'obs':>6} {'action':>10} {'B':>3} {'T':>3} {'ms med':>9} {'min':>8} "
          f"{'max':>8} {'upd/s':>7} {'steps/s':>9} {'peak MB':>8}")
    for size in a.size:
        for obs in a.obs:
            for action in a.action:
                r = bench(size, obs, action, a.batch, a.length, a.iters, a.warmup, device)
                rows.append(r)
                print(f"{size:>5} {obs:>6} {action:>10} {a.batch:>3} {a.length:>3} "
                      f"{r['ms_median']:9.1f} {r['ms_min']:8.1f} {r['ms_max']:8.1f} "
                      f"{r['updates_per_s']:7.2f} {r['replayed_steps_per_s']:9.0f} "
                      f"{r['peak_mem_mb']:8.0f}", flush=True)
    out = Path(a.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine(), "results": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
