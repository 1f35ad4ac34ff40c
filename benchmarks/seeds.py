"""Several seeds in one batched update (lucid.batched) against one seed's update and against
K seeds updated one after another.

    python benchmarks/seeds.py [--sizes nano,mini,1m] [--k 4] [--batch 16x64] [--device cpu]
                               [--threads 2] [--precision fp32] [--repeats 9]
                               [--compile] [--graph] [--out results/seeds.json]

Per size: the median ms of one update of one agent, of K agents as one batched update (vmap),
and of K agents updated in turn (BatchedAgents' other mode, and what K runs in one process
would cost), with the ratios batched / one and sequential / batched. With `--compile`, also
the batched update compiled as a whole (what `--seeds` runs with train.compile=true where it
batches) and K compiled agents updated in turn; with `--graph` (CUDA), K graphed agents in
turn and the batched update captured as one graph (`--seeds` with train.cuda_graph=true; with
`--compile` too, compiled and graphed), against one seed's update in the same fast form.
Discrete actions, a 4-dim vector observation. Memory per added seed: the parameters and Adam
moments of one agent (each seed holds its own), and on CUDA the peak memory of the batched
update for K against one. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import gymnasium as gym
import torch

from lucid.agents import agent_class
from lucid.batched import BatchedAgents, stack_batches
from lucid.specs import ActionSpec, ObsSpec
from train_step import bench_config

OBS = ObsSpec(vectors={"vector": 4})
ACT = ActionSpec.from_space(gym.spaces.Discrete(3))


def _batch(B: int, T: int, seed: int, device) -> dict:
    g = torch.Generator().manual_seed(seed)
    first = torch.zeros(B, T, dtype=torch.bool)
    first[:, 0] = True
    action = torch.nn.functional.one_hot(torch.randint(0, 3, (B, T), generator=g), 3).float()
    batch = {"obs": {"vector": torch.randn(B, T, 4, generator=g)}, "action": action,
             "reward": torch.randn(B, T, generator=g), "is_first": first,
             "is_terminal": torch.zeros(B, T, dtype=torch.bool),
             "is_last": torch.zeros(B, T, dtype=torch.bool)}
    return {k: {kk: vv.to(device) for kk, vv in v.items()} if isinstance(v, dict)
            else v.to(device) for k, v in batch.items()}


def _time(fn, repeats: int, device) -> float:
    for _ in range(3):  # warm-up: lazy optimizer state, allocator
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def measure(size: str, k: int, B: int, T: int, device, repeats: int,
            precision: str = "fp32", compile_: bool = False, graph: bool = False) -> dict:
    cfg = bench_config(size, batch_size=B, batch_length=T, compile=False, cuda_graph=False,
                       precision=precision)  # a Nature size: that recipe's agent

    def agent(seed, cfg=cfg):
        torch.manual_seed(seed)
        return agent_class(cfg)(OBS, ACT, cfg, device)
    one, b1 = agent(0), _batch(B, T, 0, device)
    singles = [agent(s) for s in range(k)]
    batched = BatchedAgents([agent(s) for s in range(k)], vmap=True)
    bs = [_batch(B, T, s, device) for s in range(k)]
    bk = stack_batches(bs)
    row = {"size": size, "k": k, "batch": f"{B}x{T}", "precision": precision}
    row["one_ms"] = _time(lambda: one.train_step(b1), repeats, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        one.train_step(b1)
        peak_one = torch.cuda.max_memory_allocated(device)
    row["batched_ms"] = _time(lambda: batched.train_step(bk), repeats, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        batched.train_step(bk)
        row["peak_one_gib"] = peak_one / 2**30
        row["peak_batched_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        row["peak_per_added_seed_gib"] = (row["peak_batched_gib"] - row["peak_one_gib"]) / max(
            1, k - 1)

    def in_turn():
        for a, b in zip(singles, bs):
            a.train_step(b)
    row["sequential_ms"] = _time(in_turn, repeats, device)
    row["batched_over_one"] = row["batched_ms"] / row["one_ms"]
    row["sequential_over_batched"] = row["sequential_ms"] / row["batched_ms"]
    if compile_ or graph:  # each agent's own fast update, in turn (the warm-up compiles)
        fast_cfg = bench_config(size, batch_size=B, batch_length=T, compile=compile_,
                                cuda_graph=graph, precision=precision)
        fast = BatchedAgents([agent(s, fast_cfg) for s in range(k)], vmap=False)
        row["fast"] = "+".join(n for n, on in (("compiled", compile_), ("graph", graph)) if on)
        row["fast_turn_ms"] = _time(lambda: fast.train_step(bk), repeats, device)
        row["fast_turn_over_batched"] = row["fast_turn_ms"] / row["batched_ms"]
        one_fast = agent(0, fast_cfg)
        row["one_fast_ms"] = _time(lambda: one_fast.train_step(b1), repeats, device)
    if graph:  # the batched update captured as one graph (compiled too with --compile)
        graph_cfg = bench_config(size, batch_size=B, batch_length=T, compile=compile_,
                                 cuda_graph=True, precision=precision)
        graphed = BatchedAgents([agent(s, graph_cfg) for s in range(k)], vmap=True)
        row["graphed_batched_ms"] = _time(lambda: graphed.train_step(bk), repeats, device)
        row["graphed_batched_over_one_fast"] = row["graphed_batched_ms"] / row["one_fast_ms"]
        row["fast_turn_over_graphed_batched"] = (row["fast_turn_ms"]
                                                 / row["graphed_batched_ms"])
    if compile_:  # the batched update compiled as a whole
        comp_cfg = bench_config(size, batch_size=B, batch_length=T, compile=True,
                                cuda_graph=False, precision=precision)
        comp = BatchedAgents([agent(s, comp_cfg) for s in range(k)], vmap=True)
        row["compiled_batched_ms"] = _time(lambda: comp.train_step(bk), repeats, device)
        row["compiled_batched_over_one"] = row["compiled_batched_ms"] / row["one_ms"]
        if "fast_turn_ms" in row:
            row["fast_turn_over_compiled_batched"] = (row["fast_turn_ms"]
                                                     / row["compiled_batched_ms"])
    state = sum(p.numel() for m in one.modules().values() for p in m.state_dict().values())
    trained = sum(sum(p.numel() for p in net.parameters()) for net in
                  (one.wm, one.actor, one.critic.net))
    row["state_mib_per_seed"] = (state + 2 * trained) * 4 / 2**20  # + the optimizers' 2 moments
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="nano,mini")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batch", default="16x64", help="B x T")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="fp32", help="fp32 or bf16")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--compile", action="store_true",
                    help="also K compiled agents in turn (--seeds with train.compile=true)")
    ap.add_argument("--graph", action="store_true",
                    help="also K graphed agents in turn and the batched update as one graph "
                         "(CUDA; --seeds with train.cuda_graph=true)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "seeds.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    B, T = (int(x) for x in args.batch.lower().split("x"))
    rows = [measure(s, args.k, B, T, device, args.repeats, args.precision, args.compile,
                    args.graph) for s in args.sizes.split(",")]
    print(f"{'size':6} {'K':>2} {'batch':>6} {'one ms':>8} {'batched':>8} {'in turn':>8} "
          f"{'batched/one':>11} {'in turn/batched':>15} {'MiB/seed':>8}")
    for r in rows:
        print(f"{r['size']:6} {r['k']:>2} {r['batch']:>6} {r['one_ms']:8.1f} "
              f"{r['batched_ms']:8.1f} {r['sequential_ms']:8.1f} {r['batched_over_one']:11.2f} "
              f"{r['sequential_over_batched']:15.2f} {r['state_mib_per_seed']:8.2f}")
        if "fast" in r:
            print(f"{'':6} {r['fast']} in turn: {r['fast_turn_ms']:.1f} ms "
                  f"({r['fast_turn_over_batched']:.2f}x the batched update's time); "
                  f"one seed {r['fast']}: {r['one_fast_ms']:.1f} ms")
        if "graphed_batched_ms" in r:
            print(f"{'':6} {r['fast']} batched: {r['graphed_batched_ms']:.1f} ms "
                  f"({r['graphed_batched_over_one_fast']:.2f}x one seed's {r['fast']} update)")
        if "compiled_batched_ms" in r:
            print(f"{'':6} compiled batched: {r['compiled_batched_ms']:.1f} ms "
                  f"({r['compiled_batched_over_one']:.2f}x one seed's eager update)")
    info = {"device": str(device), "threads": args.threads, "torch": torch.__version__,
            "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(info, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
