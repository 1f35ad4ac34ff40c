"""Replay sampling speed: `Replay.sample(B, T)` + `to_batch` at several capacities.

    python benchmarks/replay.py                                   # vector and image, 1e4..1e6
    python benchmarks/replay.py --obs image --capacity 1e6 --tmpdir /big/disk
    python benchmarks/replay.py --obs vector --capacity 1e4 1e5 --iters 50

A replay of `capacity` steps is filled in bulk (random 64x64x3 uint8 images or 4-float
vectors, 6-dim actions, reward and flags), then `--iters` batches of B x T windows are drawn
(median / min / max ms; sampling and the numpy -> torch conversion also timed separately).
Replays larger than `--memmap-above-gb` (default 4 GB) are memory-mapped files in a temporary
directory (`Replay(..., directory=..., memmap=True)`); the 1e6 image replay is ~12 GB on disk.
Reported memory: the process's RSS after filling and after sampling, and its peak (for a
memory-mapped replay RSS counts the file pages this process touched: the pages written while
filling count until the kernel drops them). The target in issue 7: a 16 x 64 batch of images
in <= 5 ms on the CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, peak_rss_mb, rss_anon_mb, rss_mb, write_json  # noqa: E402

from lucid.specs import ObsSpec  # noqa: E402
from lucid.replay import Replay, to_batch  # noqa: E402


def obs_spec_for(obs: str) -> ObsSpec:
    space = (gym.spaces.Box(-1, 1, (4,)) if obs == "vector"
             else gym.spaces.Box(0, 255, (64, 64, 3), np.uint8))
    return ObsSpec.from_space(space)


def fill(replay: Replay, block: int = 4096, seed: int = 0) -> float:
    """Write every slot of the ring (bulk copies of a random block of steps, straight into
    the arrays: the layout `add()` produces, without 1e6 Python calls). Returns seconds."""
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    src = {}
    for k, (shape, dtype) in replay.fields.items():
        n = (replay.num_envs, min(block, replay.per_env), *shape)
        if dtype == np.uint8:
            src[k] = rng.integers(0, 256, n, dtype=np.uint8)
        elif dtype == np.bool_:
            src[k] = rng.random(n) < 0.01
        else:
            src[k] = rng.standard_normal(n).astype(dtype)
    for start in range(0, replay.per_env, block):
        end = min(start + block, replay.per_env)
        for k, arr in replay.data.items():
            arr[:, start:end] = src[k][:, :end - start]
    for arr in replay.data.values():
        if isinstance(arr, np.memmap):
            arr.flush()
    replay.count = replay.per_env
    replay.pos = 0
    return time.perf_counter() - t0


def bench(obs: str, capacity: int, B: int, T: int, iters: int, warmup: int, num_envs: int,
          memmap: bool, tmpdir: str | None, device: torch.device) -> dict:
    spec = obs_spec_for(obs)
    with tempfile.TemporaryDirectory(dir=tmpdir, prefix="lucid-replay-bench-") as d:
        rss0 = rss_mb()
        replay = Replay.for_spaces(spec, 6, capacity, num_envs, seed=0,
                                   directory=d if memmap else None, memmap=memmap,
                                   chunk_length=10 ** 12)  # never write chunk files here
        fill_s = fill(replay)
        rss_filled = rss_mb()
        t_sample, t_convert, t_total = [], [], []
        for i in range(warmup + iters):
            t0 = time.perf_counter()
            s = replay.sample(B, T)
            t1 = time.perf_counter()
            batch = to_batch(s, device)
            if device.type == "cuda":
                torch.cuda.synchronize()
            t2 = time.perf_counter()
            if i >= warmup:
                t_sample.append(t1 - t0)
                t_convert.append(t2 - t1)
                t_total.append(t2 - t0)
        del batch
        med = statistics.median(t_total)
        row = {"obs": obs, "capacity": capacity, "num_envs": num_envs, "B": B, "T": T,
               "memmap": memmap, "replay_gb": replay.nbytes / 1e9, "fill_s": fill_s,
               "ms_median": 1e3 * med, "ms_min": 1e3 * min(t_total),
               "ms_max": 1e3 * max(t_total),
               "sample_ms_median": 1e3 * statistics.median(t_sample),
               "to_batch_ms_median": 1e3 * statistics.median(t_convert),
               "batches_per_s": 1 / med,
               "rss_before_mb": rss0, "rss_filled_mb": rss_filled, "rss_after_mb": rss_mb(),
               "rss_anon_after_mb": rss_anon_mb(),
               "peak_rss_mb": peak_rss_mb(), "iters": iters, "device": str(device)}
        del replay
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--obs", nargs="+", default=["vector", "image"], choices=["vector", "image"])
    p.add_argument("--capacity", nargs="+", type=float, default=[1e4, 1e5, 1e6])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--num-envs", type=int, default=1)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--memmap-above-gb", type=float, default=4.0,
                   help="memory-map replays larger than this (0 = always)")
    p.add_argument("--tmpdir", default=None, help="where memory-mapped replays go")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default="benchmarks/results/replay.json")
    a = p.parse_args(argv)
    device = torch.device(a.device)
    rows = []
    print(f"{'obs':>6} {'capacity':>9} {'GB':>6} {'memmap':>6} {'ms med':>8} {'min':>7} {'max':>7} "
          f"{'sample':>7} {'to_batch':>8} {'fill s':>7} {'RSS MB':>8} {'anon MB':>8} "
          f"{'peak MB':>8}")
    for obs in a.obs:
        for cap in a.capacity:
            cap = int(cap)
            spec = obs_spec_for(obs)
            step_bytes = Replay.for_spaces(spec, 6, a.num_envs, a.num_envs).step_bytes
            memmap = cap * step_bytes / 1e9 > a.memmap_above_gb
            r = bench(obs, cap, a.batch, a.length, a.iters, a.warmup, a.num_envs, memmap,
                      a.tmpdir, device)
            rows.append(r)
            print(f"{obs:>6} {cap:>9.0e} {r['replay_gb']:6.3f} {str(memmap):>6} "
                  f"{r['ms_median']:8.2f} {r['ms_min']:7.2f} {r['ms_max']:7.2f} "
                  f"{r['sample_ms_median']:7.2f} {r['to_batch_ms_median']:8.2f} "
                  f"{r['fill_s']:7.1f} {r['rss_after_mb']:8.0f} {r['rss_anon_after_mb']:8.0f} "
                  f"{r['peak_rss_mb']:8.0f}",
                  flush=True)
    write_json(a.json, {"machine": machine(), "args": vars(a), "results": rows})


if __name__ == "__main__":
    main()
