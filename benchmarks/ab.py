"""Interleaved A/B timing of agent updates: ratios that survive a noisy machine.

    python benchmarks/ab.py --size nano --variant "plain=--malloc default --set \
        train.onehot_gather=false" --variant ours= --variant compiled=--compile
    python benchmarks/ab.py --size mini --obs image --rounds 15 --variant a= \
        --variant "b=--set train.channels_last=false"

Each variant is a persistent worker process (its own malloc thresholds, config overrides and
compile caches) holding one agent and one synthetic batch (those of `train_step.py`). The
workers warm up one after another (compiling, for `--compile`), then take turns: in every
round each worker runs one update while the others wait, in alternating order (forward, then
reversed). So a slow stretch of the machine lands on every variant of a round alike, and the
per-round ratios `first variant's ms / this variant's ms` cancel drifts that make ratios of
separate runs' medians move by tens of percent here. Prints per variant the median / min / max
ms and the median ratio to the first variant with its interquartile range; writes JSON with
the machine's description. A variant is `NAME=OPTIONS`, the options any of `--compile`,
`--malloc tuned|default`, `--set KEY=VALUE ...`, `--tree PATH` (lucid imported from another
checkout, e.g. `git worktree add /tmp/base HEAD~1`: two commits timed against each other;
none: `NAME=`). Numbers, not asserts.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import agent_shape_args, machine, write_json  # noqa: E402


def variant_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="variant", add_help=False)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--malloc", default="tuned", choices=["tuned", "default"])
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("--tree", default=None, metavar="PATH",
                   help="import lucid from this checkout (e.g. a `git worktree` of another "
                        "commit) instead of this one")
    return p


def worker(a: argparse.Namespace, v: argparse.Namespace) -> None:
    """Build the agent, warm up, print `ready`; then one update per `go` line on stdin,
    answering with its seconds."""
    if a.threads:
        torch.set_num_threads(a.threads)
    if v.tree:
        sys.path.insert(0, str(Path(v.tree).resolve()))
    import lucid
    from lucid.system import tune_malloc
    if v.malloc == "tuned":
        tune_malloc()
    from train_step import agent_and_batch
    agent, batch = agent_and_batch(a.size, a.obs, a.action, a.batch, a.length, "cpu", v.set,
                                   compile=v.compile)
    t0 = time.perf_counter()
    for _ in range(a.warmup):
        agent.train_step(batch)
    print(json.dumps({"ready": time.perf_counter() - t0,
                      "lucid": str(Path(lucid.__file__).parent)}), flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        t = time.perf_counter()
        agent.train_step(batch)
        print(json.dumps({"s": time.perf_counter() - t}), flush=True)


def _reply(proc: subprocess.Popen, name: str) -> dict:
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"variant {name!r} exited with code {proc.wait()} (its error is "
                           f"printed above)")
    return json.loads(line)


def quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    agent_shape_args(p, size="nano")
    p.add_argument("--threads", type=int, default=2, help="torch threads per worker")
    p.add_argument("--warmup", type=int, default=3, help="untimed updates (compiled: >= 2)")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--variant", action="append", default=[], metavar="NAME=OPTIONS",
                   help='e.g. "plain=--malloc default" or compiled=--compile or ours= ; the '
                        "first variant is the baseline of the ratios")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", default="benchmarks/results/ab.json")
    a = p.parse_args(argv)
    if a.worker is not None:
        return worker(a, variant_parser().parse_args(shlex.split(a.worker)))
    if len(a.variant) < 2 or any("=" not in v for v in a.variant):
        p.error(f"give at least two variants as NAME=OPTIONS (got {a.variant}), e.g. "
                f'--variant ours= --variant compiled=--compile')
    a.variant = [tuple(v.split("=", 1)) for v in a.variant]
    names = [n for n, _ in a.variant]
    if len(set(names)) != len(names):
        p.error(f"variant names must differ: {names}")
    for name, opts in a.variant:  # refuse a bad option before anything starts
        try:
            tree = variant_parser().parse_args(shlex.split(opts)).tree
        except SystemExit:
            p.error(f"variant {name!r}: bad options {opts!r} (use --compile, --malloc "
                    f"tuned|default, --set KEY=VALUE ..., --tree PATH)")
        if tree and not (Path(tree) / "lucid" / "__init__.py").is_file():
            p.error(f"variant {name!r}: --tree {tree} holds no lucid/__init__.py (make one "
                    f"with `git worktree add {tree} COMMIT`)")
    common = ["--size", a.size, "--obs", a.obs, "--action", a.action, "--batch", str(a.batch),
              "--length", str(a.length), "--threads", str(a.threads), "--warmup", str(a.warmup)]
    procs, ready = {}, {}
    try:
        for name, opts in a.variant:  # one at a time: compilations do not overlap
            procs[name] = subprocess.Popen(
                [sys.executable, __file__, *common, f"--worker={opts}"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            reply = _reply(procs[name], name)
            ready[name] = reply["ready"]
            print(f"{name}: warm after {ready[name]:.1f} s (lucid from {reply['lucid']})",
                  flush=True)
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(a.rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                procs[name].stdin.write("go\n")
                procs[name].stdin.flush()
                times[name].append(_reply(procs[name], name)["s"])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.stdin.close()
                proc.wait(30)

    base = names[0]
    rows = []
    print(f"{a.size} {a.obs} {a.action} B={a.batch} T={a.length} threads={a.threads}, "
          f"{a.rounds} rounds")
    print(f"{'variant':>12} {'ms med':>8} {'min':>8} {'max':>8} {'vs ' + base:>14} "
          f"{'IQR':>13}")
    for name, opts in a.variant:
        ms = [1e3 * t for t in times[name]]
        ratios = [b / t for b, t in zip(times[base], times[name])]
        q1, q3 = quartiles(ratios)
        rows.append({"variant": name, "options": opts, "warmup_s": ready[name],
                     "ms": ms, "ms_median": statistics.median(ms), "ms_min": min(ms),
                     "ms_max": max(ms), "ratio_to_first_median": statistics.median(ratios),
                     "ratio_to_first_q1": q1, "ratio_to_first_q3": q3})
        print(f"{name:>12} {rows[-1]['ms_median']:8.1f} {min(ms):8.1f} {max(ms):8.1f} "
              f"{statistics.median(ratios):13.2f}x {q1:6.2f}-{q3:.2f}x", flush=True)
    write_json(a.json, {"machine": machine(), "args": vars(a), "results": rows})


if __name__ == "__main__":
    main()
