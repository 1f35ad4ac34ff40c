"""Where one update's time goes: torch.profiler over a few agent updates, by operator.

    python benchmarks/profile_step.py --size mini --threads 2
    python benchmarks/profile_step.py --size XL --device cuda --precision bf16 \
        --set train.onehot_gather=false --json xl.json

Builds the agent and a synthetic batch as benchmarks/train_step.py does (B=16, T=64 by
default), runs `--warmup` updates, then profiles `--iters` eager updates (CPU, and CUDA
kernels on a GPU) and prints the operators that took the most time, per update: on CUDA by
their kernels' device time, on the CPU by their own CPU time. The JSON holds the machine, the
arguments and the top operators with their call counts. `--set KEY=VALUE` overrides config
keys (`train.compile=true` profiles the compiled update: its fused kernels show up by their
generated names). Numbers, not asserts; a profile slows the update, so take its total from
train_step.py, and its shares from here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import agent_shape_args, machine, write_json  # noqa: E402
from train_step import agent_and_batch  # noqa: E402

from lucid.agent import Agent  # noqa: E402


def profile_updates(agent: Agent, batch: dict, warmup: int, iters: int, top: int) -> dict:
    cuda = agent.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        agent.train_step(batch)
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(iters):
            agent.train_step(batch)
        sync()
    events = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    # the device time attribute is named self_cuda_time_total in older torch releases
    if cuda and not hasattr(events[0], key):
        key = "self_cuda_time_total"
    total = sum(getattr(e, key) for e in events)
    rows = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:top]
    return {"time": "device" if cuda else "cpu", "total_ms_per_update": total / iters / 1e3,
            "ops": [{"name": e.key, "ms_per_update": getattr(e, key) / iters / 1e3,
                     "share": getattr(e, key) / total if total else 0.0,
                     "calls_per_update": e.count / iters} for e in rows]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    agent_shape_args(p, size="mini")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    p.add_argument("--warmup", type=int, default=2, help="updates before profiling")
    p.add_argument("--iters", type=int, default=3, help="profiled updates")
    p.add_argument("--top", type=int, default=25, help="operators to list")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config overrides, e.g. train.onehot_gather=false")
    p.add_argument("--json", default=None, help="write the profile here")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    agent, batch = agent_and_batch(a.size, a.obs, a.action, a.batch, a.length, device, a.set,
                                   precision=a.precision, compile=False,
                                   cuda_graph=False)  # (a replayed graph is one launch)
    out = profile_updates(agent, batch, a.warmup, a.iters, a.top)
    print(f"{a.size} {a.obs} {a.action} {a.precision} B={a.batch} T={a.length} on {device}: "
          f"{out['total_ms_per_update']:.1f} ms of {out['time']} time per profiled update")
    print(f"{'ms/update':>10} {'share':>6} {'calls':>7}  operator")
    for r in out["ops"]:
        print(f"{r['ms_per_update']:10.2f} {100 * r['share']:5.1f}% "
              f"{r['calls_per_update']:7.0f}  {r['name'][:90]}")
    if a.json:
        write_json(a.json, {"machine": machine(), "args": vars(a), **out})


if __name__ == "__main__":
    main()
