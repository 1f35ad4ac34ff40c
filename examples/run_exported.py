"""Run a policy that `lucid export` wrote, with onnxruntime and numpy only (no torch, no
lucid): what a robot, a game server or any machine without PyTorch needs.

    lucid export runs/CartPole-v1-... --out policy.onnx      # writes policy.onnx + policy.json
    python examples/run_exported.py policy.onnx              # a few steps on made-up inputs

`Policy` keeps the recurrent state between calls; give it each observation as the env
returns it (a dict of leaves for a Dict space, keyed as in policy.json) and call `reset()`
(or pass `first=True`) when an episode starts. With gymnasium installed, `--env ID` plays
episodes in that env.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnxruntime


class Policy:
    """One exported lucid policy, stepped one observation (or a batch of N) at a time."""

    def __init__(self, path: str | Path, seed: int = 0):
        path = Path(path)
        self.info = json.loads(path.with_suffix(".json").read_text())
        self.session = onnxruntime.InferenceSession(str(path),
                                                    providers=["CPUExecutionProvider"])
        self.obs_inputs = [i for i in self.info["inputs"] if i["name"].startswith("obs")]
        self.noise = next((i for i in self.info["inputs"] if i["name"] == "noise"), None)
        self.state_shapes = {i["name"]: i["shape"][1:] for i in self.info["inputs"]
                             if i["name"] in ("h", "z", "action")}
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.rng = np.random.default_rng(seed)  # the latent's uniforms
        self.state = None

    def reset(self) -> None:
        self.state = None

    def __call__(self, obs, first: bool = False, batch: bool = False):
        """The env action(s) for `obs` (one observation, or with `batch` a batch of N)."""
        leaves = [np.asarray(obs[i["key"]] if len(self.obs_inputs) > 1 else obs,
                             dtype=i["dtype"]) for i in self.obs_inputs]
        if not batch:
            leaves = [x[None] for x in leaves]
        n = leaves[0].shape[0]
        if self.state is None:
            first = True
            self.state = [np.zeros((n, *shape), np.float32)
                          for shape in self.state_shapes.values()]
        groups = self.state_shapes["z"][0]
        feeds = {i["name"]: x for i, x in zip(self.obs_inputs, leaves)}
        feeds.update(zip(("h", "z", "action"), self.state))
        feeds["is_first"] = np.full((n,), first, bool)
        feeds["u"] = self.rng.random((n, groups, 1), dtype=np.float32)
        if self.noise is not None:  # a sampled policy: uniforms, then normals
            cats = self.rng.random((n, self.noise["uniform"]), dtype=np.float32)
            eps = self.rng.standard_normal((n, self.noise["normal"]), dtype=np.float32)
            feeds["noise"] = cats[..., None] if not self.noise["normal"] else \
                np.concatenate([cats, eps], -1)
        out = dict(zip(self.outputs, self.session.run(None, feeds)))
        self.state = [out["h_next"], out["z_next"], out["action_next"]]
        acts = {}
        for o in self.info["outputs"]:
            if "kind" in o:
                a = out[o["name"]]  # MultiBinary: true above 0.5, as lucid acts
                a = a > 0.5 if o["env_dtype"] == "bool" else a.astype(o["env_dtype"])
                acts[tuple(o["path"])] = a if batch else a[0]
        if list(acts) == [()]:
            return acts[()]
        return _nest(acts)


def _nest(leaves: dict):
    """{("gear",): a, ("steer",): b} -> {"gear": a, "steer": b} (Dict action spaces)."""
    out: dict = {}
    for path, value in leaves.items():
        node = out
        for step in path[:-1]:
            node = node.setdefault(step, {})
        node[path[-1]] = value
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="run a policy that `lucid export` wrote")
    ap.add_argument("policy", help="the .onnx file (its .json beside it)")
    ap.add_argument("--env", help="a gymnasium id to play episodes in (needs gymnasium)")
    ap.add_argument("--episodes", type=int, default=3)
    args = ap.parse_args()
    policy = Policy(args.policy)
    if args.env is None:  # made-up observations: shows the shapes and that it runs
        obs = {i["key"]: np.zeros(i["shape"][1:], i["dtype"]) for i in policy.obs_inputs}
        obs = obs if len(obs) > 1 else next(iter(obs.values()))
        for t in range(3):
            print(f"step {t}: action {policy(obs)!r}")
        return
    import gymnasium as gym
    env = gym.make(args.env)
    for ep in range(args.episodes):
        obs, _ = env.reset(seed=ep)
        policy.reset()
        total, done = 0.0, False
        while not done:
            obs, reward, term, trunc, _ = env.step(policy(obs))
            total, done = total + float(reward), term or trunc
        print(f"episode {ep}: return {total:g}")


if __name__ == "__main__":
    main()
