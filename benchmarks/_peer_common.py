"""What the peer workers (_peer_rllib.py, _peer_sheeprl.py) share: their command line, the
timing loop and the JSON line they print. Runs inside the peers' virtualenvs, so it imports
only the standard library and torch."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import torch


def worker_args() -> argparse.Namespace:
    """The shapes peers.py asks for; sets torch's thread count."""
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="XS")
    p.add_argument("--obs", default="vector")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    return a


def time_updates(update: Callable, a: argparse.Namespace,
                 prepare: Callable = lambda: None) -> list[float]:
    """Seconds of `update(prepare())` for a.iters updates after a.warmup; `prepare` (untimed)
    makes each update's input."""
    times = []
    for i in range(a.warmup + a.iters):
        x = prepare()
        t0 = time.perf_counter()
        update(x)
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    return times


def report(peer: str, version: str, a: argparse.Namespace, times: list[float], horizon: int,
           **extra) -> None:
    """The one JSON line peers.py reads."""
    med = statistics.median(times)
    print(json.dumps({"peer": peer, "version": version, "torch": torch.__version__,
                      "size": a.size, "obs": a.obs, "B": a.batch, "T": a.length,
                      "horizon": horizon, "threads": torch.get_num_threads(),
                      "ms_median": 1e3 * med, "ms_min": 1e3 * min(times),
                      "ms_max": 1e3 * max(times), "updates_per_s": 1 / med,
                      "iters": a.iters, "warmup": a.warmup, **extra}))
