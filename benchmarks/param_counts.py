"""Trainable parameter counts per model size for the reference spaces, per component.

    python benchmarks/param_counts.py [--json benchmarks/results/param_counts.json]
    python benchmarks/param_counts.py --recipe nature --sizes 12m --obs image:96x96x1 \
        --actions 18

"cartpole" = Box(4,) observation and Discrete(2); "atari" = 64x64x3 uint8 image and
Discrete(6) — the spaces of the reference table in shared/reference/DREAMERV3.md.
`--recipe nature`: the Nature recipe's networks (lucid/nature_model.py) at its sizes
(1m ... 400m) for one space, `--obs image:HxWxC` or `vector:N` and `--actions N` (discrete),
the world model, actor, critic and slow critic counted apart, and a last line
`total trained N, with slow critic M`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lucid.config import SIZES, make_config  # noqa: E402
from lucid.specs import ActionSpec, ObsSpec  # noqa: E402
from lucid.world_model import WorldModel  # noqa: E402
from lucid.behavior import Actor, Critic  # noqa: E402

SPACES = {
    "cartpole": (gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2)),
    "atari": (gym.spaces.Box(0, 255, (64, 64, 3), np.uint8), gym.spaces.Discrete(6)),
}


def count(module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def counts(size: str, space: str) -> dict:
    obs, act = SPACES[space]
    cfg = make_config("default", model={"size": size})
    o, a = ObsSpec.from_space(obs), ActionSpec.from_space(act)
    wm = WorldModel(o, a.dim, cfg.model)
    actor, critic = Actor(wm.feat_dim, a, cfg.model), Critic(wm.feat_dim, cfg.model)
    comps = {name: count(getattr(wm, name)) for name in
             ("encoder", "post_mlp", "post_out", "prior_mlp", "prior_out", "seq_in", "gru",
              "reward", "cont", "decoder")}
    comps["initial_h"] = wm.initial_h.numel()
    return {"size": size, "space": space, "world_model": count(wm), "actor": count(actor),
            "critic": count(critic.net), "components": comps}


def nature_counts(size: str, obs: str, actions: int) -> dict:
    from lucid.nature_model import nature_modules
    kind, _, shape = obs.partition(":")
    dims = tuple(int(x) for x in shape.lower().split("x"))
    if kind == "image" and len(dims) == 3:
        space = gym.spaces.Box(0, 255, dims, np.uint8)
    elif kind == "vector" and len(dims) == 1:
        space = gym.spaces.Box(-1, 1, dims, np.float32)
    else:
        raise SystemExit(f"--obs {obs!r}: give image:HxWxC or vector:N")
    mods = nature_modules(ObsSpec.from_space(space), ActionSpec.from_space(
        gym.spaces.Discrete(actions)), size)
    out = {name: count(m) for name, m in mods.items()}
    out["slow_critic"] = sum(p.numel() for p in mods["critic"].slow.parameters())
    return out


def main_nature(a) -> None:
    for size in a.sizes:
        c = nature_counts(size, a.obs, a.actions)
        print(f"{size}: " + ", ".join(f"{k} {v:,}" for k, v in c.items()))
        trained = c["world_model"] + c["actor"] + c["critic"]
        print(f"total trained {trained:,}, with slow critic {trained + c['slow_critic']:,}")


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", nargs="+", default=None)
    p.add_argument("--recipe", default="2023", help="2023 or nature")
    p.add_argument("--obs", default="image:64x64x3", help="nature: image:HxWxC or vector:N")
    p.add_argument("--actions", type=int, default=6, help="nature: discrete actions")
    p.add_argument("--json", default="benchmarks/results/param_counts.json")
    a = p.parse_args(argv)
    if a.recipe == "nature":
        from lucid.nature_model import NATURE_SIZES
        a.sizes = a.sizes or list(NATURE_SIZES)
        return main_nature(a)
    a.sizes = a.sizes or list(SIZES)
    rows = []
    print(f"{'size':>5} {'space':>9} {'world model':>12} {'actor':>10} {'critic':>10} {'total':>12}")
    for size in a.sizes:
        for space in SPACES:
            r = counts(size, space)
            rows.append(r)
            total = r["world_model"] + r["actor"] + r["critic"]
            print(f"{size:>5} {space:>9} {r['world_model']:>12,} {r['actor']:>10,} "
                  f"{r['critic']:>10,} {total:>12,}")
    out = Path(a.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
