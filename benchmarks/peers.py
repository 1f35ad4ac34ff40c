"""The same update shapes through lucid and its peers, measured in one invocation.

    python benchmarks/peers.py                               # XS and S, vector and image
    python benchmarks/peers.py --peers sheeprl --size XS --obs vector --iters 3
    python benchmarks/peers.py --peers sheeprl --size 1m 12m --obs vector image --threads 2
    python benchmarks/peers.py --setup-only                  # just build the virtualenvs

Peers: RLlib 2.60.0's DreamerV3 (torch) and sheeprl 0.8.4's `dreamer_v3` (the 2023 recipe).
A 2023 size (XS, S, ...) runs lucid's 2023 `Agent` against those. A Nature (2025) size (1m,
12m, 25m, 50m, 100m, 200m, 400m: lucid.config.NATURE_SIZES) runs lucid's Nature agent
(`nature` preset, NatureAgent.train_step) against sheeprl's `dreamer_v3_5` at the matching size
(`algo=dreamer_v3_5_1M`, ...), both with sequences that start from the zero state (lucid's
`train.replay_context=0`, sheeprl's `algo.replay_context=0`: a synthetic batch holds no stored
latents); RLlib has no Nature-recipe agent, so its rows at those sizes say "skipped" (and it
is not installed for a run of Nature sizes only). See _peer_sheeprl.py for what is timed.
Each is installed on first use into its own virtualenv under benchmarks/.peers/<name>/
(gitignored; see _peer_setup.py): torch is installed first, pinned to this interpreter's
version, and a constraints file keeps it so while the peer installs (no CUDA build is ever
downloaded). Each measurement runs in its own process (lucid too), one after another, with
the same thread count: a synthetic batch of B x T steps (vector: 4 floats, image: 64x64x3
uint8; 6 discrete actions) and H = 15, `--warmup` untimed updates, then the median of
`--iters` updates. The ratio column is peer ms / lucid ms (> 1: lucid is faster). lucid runs
with the malloc thresholds `lucid train` sets (lucid/system.py); `--peer-malloc tuned` gives
the peers the same thresholds through glibc's MALLOC_*_ environment variables.
A peer that cannot be installed or run is reported with the reason instead of a number.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _peer_setup import PEERS, ensure, python_of  # noqa: E402
from common import machine, write_json  # noqa: E402

sys.path.insert(0, str(HERE.parent))
from lucid.config import NATURE_SIZES  # noqa: E402
from lucid.system import MMAP_MAX, TRIM_THRESHOLD  # noqa: E402

NATURE_PEERS = {"sheeprl": "dreamer_v3_5"}  # the peers with a Nature-recipe agent


def skipped(peer: str, size: str) -> str | None:
    """Why `peer` has no row at `size` (None: it has one)."""
    if size in NATURE_SIZES and peer not in NATURE_PEERS:
        return f"no Nature-recipe agent in {peer} (its DreamerV3 is the 2023 recipe)"
    return None


def last_json(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def run_child(cmd: list[str], timeout: float, env: dict | None = None) -> dict:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    r = last_json(proc.stdout)
    if r is not None:
        return r
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
    return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}


def measure(who: str, size: str, obs: str, a, threads: int) -> dict:
    common = ["--size", size, "--obs", obs, "--batch", str(a.batch), "--length",
              str(a.length), "--iters", str(a.iters), "--warmup", str(a.warmup),
              "--threads", str(threads)]
    if who == "lucid":
        cmd = [sys.executable, str(HERE / "train_step.py"), "--one", "--action", "discrete",
               *common, *(["--compile"] if a.compile else [])]
    else:
        ok, msg = ensure(who)
        if not ok:
            return {"error": f"not installed: {msg}"}
        cmd = [str(python_of(who)), str(HERE / f"_peer_{who}.py"), *common]
    env = None
    if who != "lucid" and a.peer_malloc == "tuned":  # lucid/system.py's thresholds, by env
        env = dict(os.environ, MALLOC_MMAP_MAX_=str(MMAP_MAX),
                   MALLOC_TRIM_THRESHOLD_=str(TRIM_THRESHOLD))
    return run_child(cmd, a.timeout, env)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--peers", nargs="+", default=list(PEERS), choices=list(PEERS))
    p.add_argument("--size", nargs="+", default=["XS", "S"],
                   help="2023 sizes (XS, S, ...) or Nature sizes (1m, 12m, ... 400m)")
    p.add_argument("--obs", nargs="+", default=["vector", "image"], choices=["vector", "image"])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per measurement")
    p.add_argument("--peer-malloc", default="default", choices=["default", "tuned"],
                   help="peers with glibc's own malloc thresholds (as shipped) or with the "
                        "ones lucid sets (run.tune_malloc), through MALLOC_*_ environment variables")
    p.add_argument("--compile", action="store_true",
                   help="lucid's update with train.compile=true (the peers run as they ship)")
    p.add_argument("--setup-only", action="store_true")
    p.add_argument("--json", default="benchmarks/results/peers.json")
    a = p.parse_args(argv)
    threads = a.threads or torch.get_num_threads()

    setup = {}
    for peer in a.peers:
        if all(skipped(peer, size) for size in a.size):
            setup[peer] = {"ok": False, "message": "not needed: " + skipped(peer, a.size[0])}
            print(f"{peer}: not set up - {setup[peer]['message']}", flush=True)
            continue
        ok, msg = ensure(peer)
        setup[peer] = {"ok": ok, "message": msg}
        print(f"{peer}: {'ready' if ok else 'NOT AVAILABLE'} - {msg}", flush=True)
    if a.setup_only:
        return

    rows = []
    print(f"\n{'size':>4} {'obs':>6} {'who':>8} {'ms med':>9} {'min':>9} {'max':>9} "
          f"{'ratio':>7}   (ratio = peer ms / lucid ms; B={a.batch} T={a.length}, "
          f"{threads} threads)")
    for size in a.size:
        for obs in a.obs:
            ours = measure("lucid", size, obs, a, threads)
            row = {"size": size, "obs": obs, "B": a.batch, "T": a.length, "threads": threads,
                   "lucid": ours}
            if "error" in ours:
                print(f"{size:>4} {obs:>6} {'lucid':>8} failed: {ours['error']}")
            else:
                print(f"{size:>4} {obs:>6} {'lucid':>8} {ours['ms_median']:9.1f} "
                      f"{ours['ms_min']:9.1f} {ours['ms_max']:9.1f}", flush=True)
            for peer in a.peers:
                why = skipped(peer, size)
                if why:
                    row[peer] = {"skipped": why}
                    print(f"{size:>4} {obs:>6} {peer:>8} skipped: {why}", flush=True)
                    continue
                if not setup[peer]["ok"]:
                    r = {"error": f"not installed: {setup[peer]['message']}"}
                else:
                    r = measure(peer, size, obs, a, threads)
                row[peer] = r
                if "error" in r:
                    print(f"{size:>4} {obs:>6} {peer:>8} failed: {r['error']}", flush=True)
                    continue
                ratio = (r["ms_median"] / ours["ms_median"]) if "error" not in ours else None
                r["ratio_to_lucid"] = ratio
                rs = f"{ratio:7.2f}" if ratio else f"{'-':>7}"
                print(f"{size:>4} {obs:>6} {peer:>8} {r['ms_median']:9.1f} {r['ms_min']:9.1f} "
                      f"{r['ms_max']:9.1f} {rs}", flush=True)
            rows.append(row)
    write_json(a.json, {"machine": machine(), "args": vars(a), "setup": setup,
                        "results": rows, "env": {"OMP_NUM_THREADS": os.environ.get(
                            "OMP_NUM_THREADS")}})


if __name__ == "__main__":
    main()
