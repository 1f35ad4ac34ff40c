"""Trainable parameter counts per model size for the reference spaces, per component.

    python benchmarks/param_counts.py [--json benchmarks/results/param_counts.json]

"cartpole" = Box(4,) observation and Discrete(2); "atari" = 64x64x3 uint8 image and
Discrete(6) — the spaces of the reference table in shared/reference/DREAMERV3.md.
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


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", nargs="+", default=list(SIZES))
    p.add_argument("--json", default="benchmarks/results/param_counts.json")
    a = p.parse_args(argv)
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
