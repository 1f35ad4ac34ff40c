"""Milliseconds per agent update (world model + actor + critic) on synthetic batches.

    python benchmarks/train_step.py --size mini XS --obs vector image --action discrete
    python benchmarks/train_step.py --size all --obs vector image --action discrete continuous
    python benchmarks/train_step.py --size nano XXS --both          # eager and compiled
    python benchmarks/train_step.py --size 1m 12m --obs vector image  # the Nature recipe
    python benchmarks/train_step.py --size XS --threads 2 --iters 10 --json out.json
    python benchmarks/train_step.py --size S XL --obs vector image --device cuda \
        --precision fp32 bf16 --both --timeout 120 --deadline $(( $(date +%s) + 300 ))

For every (size, observation, action, mode) it prints median / min / max ms per update over
`--iters` updates after `--warmup` (the first compiled update, which compiles, is reported as
`first_s`), updates/s, replayed steps/s, peak memory (RSS on CPU, max allocated on CUDA),
floating-point operations per update (forward + backward of one `train_step`, counted with
torch's FlopCounterMode: matrix products and convolutions only, not elementwise ops), the
achieved GFLOP/s and its fraction of a matrix-multiply peak measured in the same run at the
same thread count (and, for bf16 rows, against a bf16 matmul peak). `--precision bf16` runs
the update with `train.precision=bf16` (autocast). Each configuration runs in its own
subprocess (clean peak RSS and compile caches) unless `--inline`; `--timeout` bounds one
configuration and `--deadline` (unix time) skips the ones that would start too late, so a
prepared GPU script fits its time. Updates run with the malloc thresholds that `lucid train` sets
(`run.tune_malloc`, lucid/system.py); `--malloc default` keeps glibc's own. `--set KEY=VALUE`
overrides config keys, e.g. `--set train.onehot_gather=false train.channels_last=false` to
measure without those speed switches. A Nature (2025) size (1m ... 400m,
lucid.config.NATURE_SIZES) times the Nature recipe's agent (the `nature` preset,
`lucid.agents.agent_class`: NatureAgent; one `train_step`: its one optimizer's step and the
slow-critic update) with `train.replay_context=0` (a synthetic batch holds no stored latents);
`--compile` compiles it (NatureAgent.compile); it runs in fp32 whatever --precision asks, and its
rows say so (precision `fp32`, recipe `nature`). JSON (rewritten after every
configuration, so a killed run keeps what it measured) holds the machine's description, load
average and library versions.
Numbers, not asserts.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (ACTION_KINDS, OBS_KINDS, machine, matmul_peak, peak_rss_mb,  # noqa: E402
                    write_json)

from lucid.agents import agent_class  # noqa: E402
from lucid.config import NATURE_SIZES, SIZES, for_device, make_config  # noqa: E402
from lucid.specs import ActionSpec, ObsSpec  # noqa: E402
from lucid.system import tune_malloc  # noqa: E402


def spaces(obs: str, action: str):
    """vector: 4 floats (CartPole-shaped); image: 64x64x3 uint8. 6 action dims each way:
    discrete (6 choices), continuous (a 6-dim Box) or mixed (3 choices and a 3-dim Box)."""
    obs_space = (gym.spaces.Box(-1, 1, (4,)) if obs == "vector"
                 else gym.spaces.Box(0, 255, (64, 64, 3), np.uint8))
    act_space = {"discrete": gym.spaces.Discrete(6),
                 "continuous": gym.spaces.Box(-1, 1, (6,)),
                 "mixed": gym.spaces.Tuple((gym.spaces.Discrete(3),
                                            gym.spaces.Box(-1, 1, (3,))))}[action]
    return ObsSpec.from_space(obs_space), ActionSpec.from_space(act_space)


def batch_for(obs_spec: ObsSpec, act_spec: ActionSpec, B: int, T: int, device) -> dict:
    g = torch.Generator().manual_seed(0)
    obs = {}
    for k, shape in obs_spec.images.items():
        obs[k] = torch.randint(0, 256, (B, T, *shape), generator=g, dtype=torch.uint8)
    for k, n in obs_spec.vectors.items():
        obs[k] = torch.randn(B, T, n, generator=g)
    parts = [torch.nn.functional.one_hot(torch.randint(0, n, (B, T), generator=g), n).float()
             for n in act_spec.discrete or ()]  # one-hots first, then Box dims in [-1, 1]
    if not act_spec.is_discrete:
        parts.append(torch.rand(B, T, act_spec.dim - act_spec.n_discrete, generator=g) * 2 - 1)
    action = torch.cat(parts, -1)
    batch = {"obs": obs, "action": action, "reward": torch.randn(B, T, generator=g),
             "is_first": torch.rand(B, T, generator=g) < 0.01,
             "is_terminal": torch.rand(B, T, generator=g) < 0.01}
    batch["is_last"] = batch["is_terminal"].clone()
    move = lambda x: x.to(device)  # noqa: E731
    batch["obs"] = {k: move(v) for k, v in batch["obs"].items()}
    return {k: (v if k == "obs" else move(v)) for k, v in batch.items()}


def peak_memory_mb(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_rss_mb()


def count_flops(agent, batch: dict) -> int:
    """Floating-point operations of one full update (forward and backward of all three
    losses), as counted by torch.utils.flop_counter (matmuls, convolutions, attention), on
    the uncaptured update (`train.cuda_graph` replays the same operations)."""
    from torch.utils.flop_counter import FlopCounterMode
    update = agent._update
    with FlopCounterMode(display=False) as counter:
        update(batch)
    return int(counter.get_total_flops())


def num_params(agent) -> dict[str, int]:
    """Trained parameters per network: the agent's own count where it has one (the 2023
    Agent), else those of its `modules()` that require gradients (the Nature agent: world
    model, actor, critic without its slow copy)."""
    if hasattr(agent, "num_params"):
        return agent.num_params()
    count = lambda m: sum(p.numel() for p in m.parameters() if p.requires_grad)  # noqa: E731
    return {k: n for k, m in agent.modules().items() if (n := count(m))}


def is_nature(size: str) -> bool:
    return size in NATURE_SIZES


def mode_name(compiled: bool, cuda_graph: bool) -> str:
    return ("compiled" if compiled else "eager") + ("+graph" if cuda_graph else "")


def bench_config(size: str, overrides: list[str] | None = None, device=None, **train):
    """The config the benchmarks time: the default preset at `size` with `train` keys, then
    `overrides` as KEY=VALUE. A Nature size (NATURE_SIZES) takes the `nature` preset instead,
    with train.replay_context=0 (a synthetic batch has no stored latents)."""
    preset = "default"
    if is_nature(size):
        preset, train = "nature", {"replay_context": 0, **train}
    run = {} if device is None else {"device": str(device)}
    return make_config(preset, overrides or None, model={"size": size}, train=train, run=run)


def agent_and_batch(size: str, obs: str, action: str, B: int, T: int, device,
                    overrides: list[str] | None = None, **train) -> tuple:
    """The agent the benchmarks time (`bench_config`'s, the same initial weights every
    time: NatureAgent at a Nature size) and a synthetic batch."""
    cfg = bench_config(size, overrides, device, batch_size=B, batch_length=T, **train)
    obs_spec, act_spec = spaces(obs, action)
    torch.manual_seed(0)
    return (agent_class(cfg)(obs_spec, act_spec, cfg, device),
            batch_for(obs_spec, act_spec, B, T, device))


def bench(size, obs, action, B, T, iters, warmup, device, compile_=False,
          horizon: int | None = None, precision: str = "fp32",
          overrides: list[str] | None = None) -> dict:
    train = {"precision": precision, "compile": False}  # eager; compiled below (same maths)
    if horizon:
        train["horizon"] = horizon
    agent, batch = agent_and_batch(size, obs, action, B, T, device, overrides, **train)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    flops = count_flops(agent, batch)  # also the eager warm-up
    first_s = None
    if compile_:
        agent.config.train.compile = True
        agent.compile()  # what `train.compile=true` does at construction
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for i in range(warmup + iters):
        sync()
        t0 = time.perf_counter()
        agent.train_step(batch)
        sync()
        dt = time.perf_counter() - t0
        if i == 0:
            first_s = dt
        if i >= warmup:
            times.append(dt)
    med = statistics.median(times)
    return {"size": size, "obs": obs, "action": action, "B": B, "T": T,
            "horizon": agent.config.train.horizon, "device": str(device),
            "mode": mode_name(compile_, agent.config.train.cuda_graph),  # as the device chose
            "recipe": "nature" if is_nature(size) else "2023",
            "precision": precision,
            "ms_median": 1e3 * med, "ms_min": 1e3 * min(times), "ms_max": 1e3 * max(times),
            "first_s": first_s, "updates_per_s": 1 / med, "replayed_steps_per_s": B * T / med,
            "flops_per_update": flops, "gflops_per_s": flops / med / 1e9,
            "peak_mem_mb": peak_memory_mb(device), "params": num_params(agent),
            "peak_reserved_mb": (torch.cuda.max_memory_reserved(device) / 2**20
                                 if device.type == "cuda" else None),
            "threads": torch.get_num_threads(), "iters": iters, "warmup": warmup,
            "overrides": list(overrides or [])}


def _failure(text: str, log: Path | None) -> list[str]:
    """What a failed configuration said: its last exception line (a CUDA error's own last
    line is only a hint about TORCH_USE_CUDA_DSA) and its last line; all of it in `log`."""
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(text)
    lines = [line for line in text.strip().splitlines() if line.strip()]
    raised = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b", line)]
    return list(dict.fromkeys(raised[-1:] + lines[-1:])) or ["failed"]


def run_isolated(args: list[str], timeout: float | None = None,
                 log: Path | None = None) -> dict:
    """One configuration in a fresh interpreter: its own peak RSS and compile caches. A
    failure's whole output goes to `log` (when given)."""
    cmd = [sys.executable, __file__, "--one", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        said = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return {"error": [f"timed out after {timeout:.0f} s"] + _failure(said, log)[:1]}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"error": _failure(proc.stderr + proc.stdout, log)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", nargs="+", default=["mini", "XS"],
                   help=f"any of {' '.join(SIZES)} (2023 recipe), {' '.join(NATURE_SIZES)} "
                        f"(Nature recipe), or 'all' (the 2023 sizes)")
    p.add_argument("--obs", nargs="+", default=["vector"], choices=OBS_KINDS)
    p.add_argument("--action", nargs="+", default=["discrete"], choices=ACTION_KINDS)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--horizon", type=int, default=0, help="imagination horizon (0 = config's 15)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2, help="untimed updates (compiled: >= 2)")
    p.add_argument("--compile", action="store_true", help="run with train.compile=true")
    p.add_argument("--both", action="store_true", help="run eager and compiled")
    p.add_argument("--precision", nargs="+", default=["fp32"], choices=["fp32", "bf16"],
                   help="train.precision of the update (bf16: autocast)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--timeout", type=float, default=0,
                   help="seconds allowed per configuration, compilation included (0 = none)")
    p.add_argument("--deadline", type=float, default=0,
                   help="unix time after which no configuration starts (0 = none)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--peak-n", type=int, default=2048, help="side of the peak matmul (0 = skip)")
    p.add_argument("--inline", action="store_true", help="no subprocess per configuration")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config overrides for every configuration, e.g. train.onehot_gather=false")
    p.add_argument("--malloc", default="tuned", choices=["tuned", "default"],
                   help="glibc malloc thresholds as `run.tune_malloc` sets them, or glibc's own")
    p.add_argument("--log-dir", default="", help="where a failed configuration's whole "
                   "output goes (a file per configuration)")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", default="benchmarks/results/train_step.json")
    a = p.parse_args(argv)
    named = {item.split("=")[0].strip() for item in a.set}
    if named & {"train.compile", "train.precision"}:  # the rows are named by the flags
        p.error("set compile and precision with --compile/--both and --precision, not with "
                "--set train.compile / train.precision")
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.malloc == "tuned":
        tune_malloc()
    device = torch.device(a.device)
    sizes = list(SIZES) if a.size == ["all"] else a.size
    modes = [False, True] if a.both else [a.compile]

    if a.one:  # child: one configuration, one JSON line
        r = bench(sizes[0], a.obs[0], a.action[0], a.batch, a.length, a.iters, a.warmup,
                  device, a.compile, a.horizon or None, a.precision[0], a.set)
        print(json.dumps(r))
        return
    graph = for_device(make_config("default", a.set or None),  # for the mode column
                       torch.device(a.device).type).train.cuda_graph

    peaks = {}
    for prec in a.precision if a.peak_n else []:
        dtype = torch.bfloat16 if prec == "bf16" else torch.float32
        peaks[prec] = pk = matmul_peak(a.peak_n, device=device, dtype=dtype)
        print(f"matmul peak: {pk['gflops_median']:.1f} GFLOP/s median "
              f"({pk['gflops_best']:.1f} best) {prec} {a.peak_n}^3, {pk['threads']} threads")
    rows = []

    def save():  # after every configuration: a run killed later keeps what it measured
        write_json(a.json, {"machine": machine(), "matmul_peak": peaks.get("fp32"),
                            "matmul_peaks": peaks, "args": vars(a), "results": rows,
                            "speedups": speedups(rows)}, quiet=True)

    print(f"{'size':>5} {'obs':>6} {'action':>10} {'mode':>14} {'prec':>4} {'B':>3} {'T':>3} "
          f"{'ms med':>9} {'min':>8} {'max':>8} {'upd/s':>7} {'steps/s':>8} {'GFLOP/upd':>9} "
          f"{'GFLOP/s':>8} {'%peak':>6} {'peak MB':>8} {'1st s':>6}")
    for size in sizes:
        for obs in a.obs:
            for action in a.action:
                for prec in a.precision:
                    for comp in modes:
                        mode = mode_name(comp, graph)
                        head = f"{size:>5} {obs:>6} {action:>10} {mode:>14} {prec:>4}"
                        left = a.deadline - time.time() if a.deadline else None
                        if left is not None and left < 10:
                            print(f"{head} skipped: past --deadline", flush=True)
                            rows.append({"size": size, "obs": obs, "action": action,
                                         "mode": mode, "precision": prec,
                                         "error": ["skipped: past --deadline"]})
                            save()
                            continue
                        if a.inline:
                            r = bench(size, obs, action, a.batch, a.length, a.iters, a.warmup,
                                      device, comp, a.horizon or None, prec, a.set)
                        else:
                            child = ["--size", size, "--obs", obs, "--action", action,
                                     "--batch", str(a.batch), "--length", str(a.length),
                                     "--horizon", str(a.horizon), "--iters", str(a.iters),
                                     "--warmup", str(a.warmup), "--device", a.device,
                                     "--precision", prec, "--malloc", a.malloc,
                                     *(["--set", *a.set] if a.set else []),
                                     "--threads", str(torch.get_num_threads())]
                            limits = [x for x in (a.timeout, left) if x]
                            log = Path(a.log_dir) / f"{size}-{obs}-{action}-{mode}-{prec}.err" \
                                if a.log_dir else None
                            r = run_isolated(child + (["--compile"] if comp else []),
                                             timeout=min(limits) if limits else None, log=log)
                        if "error" in r:
                            print(f"{head} failed: {r['error']}", flush=True)
                            rows.append({"size": size, "obs": obs, "action": action,
                                         "mode": mode, "precision": prec, **r})
                            save()
                            continue
                        peak = peaks.get(prec)
                        if peak:
                            r["fraction_of_peak"] = r["gflops_per_s"] / peak["gflops_median"]
                        rows.append(r)
                        save()
                        frac = f"{100 * r['fraction_of_peak']:6.1f}" if peak else f"{'-':>6}"
                        print(f"{head} {a.batch:>3} {a.length:>3} "
                              f"{r['ms_median']:9.1f} {r['ms_min']:8.1f} {r['ms_max']:8.1f} "
                              f"{r['updates_per_s']:7.2f} {r['replayed_steps_per_s']:8.0f} "
                              f"{r['flops_per_update'] / 1e9:9.1f} {r['gflops_per_s']:8.1f} "
                              f"{frac} {r['peak_mem_mb']:8.0f} {r['first_s']:6.1f}", flush=True)
    for sp in speedups(rows):
        print(f"{sp['kind']} speed-up {sp['size']} {sp['obs']} {sp['action']} "
              f"{sp['variant']}: {sp['speedup']:.2f}x")
    save()
    print(f"wrote {a.json}")


def speedups(rows: list[dict]) -> list[dict]:
    """compiled / eager at each precision, and bf16 / fp32 in each mode (ratios of medians)."""
    ok = {(r["size"], r["obs"], r["action"], r["mode"], r["precision"]): r for r in rows
          if "error" not in r}
    out = []
    for (size, obs, action, mode, prec), r in ok.items():
        base = None
        if mode == "compiled":
            base, kind, variant = ok.get((size, obs, action, "eager", prec)), "compiled/eager", prec
        if base is not None:
            out.append({"kind": kind, "size": size, "obs": obs, "action": action,
                        "variant": variant, "speedup": base["ms_median"] / r["ms_median"]})
        if prec == "bf16":
            base = ok.get((size, obs, action, mode, "fp32"))
            if base is not None:
                out.append({"kind": "bf16/fp32", "size": size, "obs": obs, "action": action,
                            "variant": mode, "speedup": base["ms_median"] / r["ms_median"]})
    return out


if __name__ == "__main__":
    main()
