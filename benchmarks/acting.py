"""Acting speed: policy step latency and environment steps/s through the Collector.

    python benchmarks/acting.py                                   # mini XS, 1..64 envs
    python benchmarks/acting.py --size XS --envs 1 8 64 --envs-kind cartpole image
    python benchmarks/acting.py --threads 2 --json benchmarks/results/acting.json

Two tables:
  * policy: ms per `agent.policy` call for N environments (vector and 64x64x3 image
    observations; encoder + one RSSM filtering step + actor, no gradients), median over
    `--iters` calls after warm-up, and the policy steps/s that gives (N / latency);
  * collector: env steps/s of `lucid.runner.Collector` for N envs (gymnasium vector env,
    sync unless `--asynchronous`), with random actions (environment and bookkeeping only)
    and with the agent choosing actions (what a training run's acting costs), for CartPole-v1
    and a synthetic 64x64x3 image env (a moving square; rendering costs ~nothing, so the
    numbers are the framework's overhead plus the agent).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, write_json  # noqa: E402

from lucid.agent import Agent  # noqa: E402
from lucid.config import make_config  # noqa: E402
from lucid.specs import ActionSpec, ObsSpec  # noqa: E402
from lucid.runner import Collector  # noqa: E402


class SquareEnv(gym.Env):
    """Synthetic 64x64x3 image env: a square moves with the action (5 discrete actions:
    stay, up, down, left, right); reward for reaching the center; 200-step episodes."""

    metadata = {"render_modes": []}

    def __init__(self, size: int = 64, episode: int = 200):
        self.size, self.episode = size, episode
        self.observation_space = gym.spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.action_space = gym.spaces.Discrete(5)
        self.pos = np.zeros(2, np.int64)
        self.t = 0

    def _obs(self):
        img = np.zeros((self.size, self.size, 3), np.uint8)
        y, x = self.pos
        img[y:y + 8, x:x + 8] = (255, 128, 0)
        return img

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.integers(0, self.size - 8, 2)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        moves = ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1))
        self.pos = np.clip(self.pos + 2 * np.array(moves[int(action)]), 0, self.size - 8)
        self.t += 1
        center = abs(self.pos - (self.size - 8) // 2).sum() <= 4
        return self._obs(), float(center), False, self.t >= self.episode, {}


ENVS = {"cartpole": lambda: gym.make("CartPole-v1"), "image": SquareEnv}


def make_agent(size: str, env_kind: str):
    env = ENVS[env_kind]()
    obs_spec = ObsSpec.from_space(env.observation_space)
    act_spec = ActionSpec.from_space(env.action_space)
    env.close()
    cfg = make_config("default", model={"size": size})
    torch.manual_seed(0)
    return Agent(obs_spec, act_spec, cfg, "cpu"), obs_spec, act_spec


def policy_latency(agent: Agent, obs_spec: ObsSpec, n: int, iters: int, warmup: int) -> dict:
    obs = {}
    for k, shape in obs_spec.images.items():
        obs[k] = torch.randint(0, 256, (n, *shape), dtype=torch.uint8)
    for k, size in obs_spec.vectors.items():
        obs[k] = torch.randn(n, size)
    is_first = torch.zeros(n, dtype=torch.bool)
    state = None
    times = []
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        action, state = agent.policy(obs, state, is_first=is_first)
        action.numpy()  # as the Collector does: the action leaves torch every step
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"ms_median": 1e3 * med, "ms_min": 1e3 * min(times), "ms_max": 1e3 * max(times),
            "policy_steps_per_s": n / med}


def collector_rate(env_kind: str, n: int, agent: Agent | None, obs_spec, act_spec,
                   steps: int, warmup: int, asynchronous: bool) -> dict:
    col = Collector([ENVS[env_kind]] * n, obs_spec, act_spec, asynchronous=asynchronous)
    try:
        for _ in range(warmup):
            col.step(agent)
        t0 = time.perf_counter()
        for _ in range(steps):
            col.step(agent)
        dt = time.perf_counter() - t0
    finally:
        col.close()
    return {"vector_steps": steps, "seconds": dt, "env_steps_per_s": n * steps / dt,
            "ms_per_vector_step": 1e3 * dt / steps}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", nargs="+", default=["mini", "XS"])
    p.add_argument("--envs", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--envs-kind", nargs="+", default=["cartpole", "image"], choices=list(ENVS))
    p.add_argument("--iters", type=int, default=50, help="timed policy calls")
    p.add_argument("--steps", type=int, default=50, help="timed vector steps per collector run")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--asynchronous", action="store_true", help="AsyncVectorEnv (a process per env)")
    p.add_argument("--skip-policy", action="store_true")
    p.add_argument("--skip-collector", action="store_true")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--json", default="benchmarks/results/acting.json")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    policy_rows, collector_rows = [], []

    if not a.skip_policy:
        print(f"{'size':>5} {'obs':>8} {'envs':>5} {'ms/policy step':>15} {'min':>7} {'max':>7} "
              f"{'policy steps/s':>15}")
        for size in a.size:
            for kind in a.envs_kind:
                agent, obs_spec, _ = make_agent(size, kind)
                for n in a.envs:
                    r = policy_latency(agent, obs_spec, n, a.iters, a.warmup)
                    policy_rows.append({"size": size, "env": kind, "envs": n, **r})
                    print(f"{size:>5} {kind:>8} {n:>5} {r['ms_median']:15.2f} {r['ms_min']:7.2f} "
                          f"{r['ms_max']:7.2f} {r['policy_steps_per_s']:15.0f}", flush=True)

    if not a.skip_collector:
        print(f"\n{'env':>8} {'envs':>5} {'actor':>7} {'ms/vector step':>15} {'env steps/s':>12}")
        for kind in a.envs_kind:
            agents = {"random": None}
            agents.update({size: make_agent(size, kind)[0] for size in a.size})
            env = ENVS[kind]()
            obs_spec = ObsSpec.from_space(env.observation_space)
            act_spec = ActionSpec.from_space(env.action_space)
            env.close()
            for n in a.envs:
                for name, agent in agents.items():
                    r = collector_rate(kind, n, agent, obs_spec, act_spec, a.steps, a.warmup,
                                       a.asynchronous)
                    collector_rows.append({"env": kind, "envs": n, "actor": name,
                                           "asynchronous": a.asynchronous, **r})
                    print(f"{kind:>8} {n:>5} {name:>7} {r['ms_per_vector_step']:15.2f} "
                          f"{r['env_steps_per_s']:12.0f}", flush=True)

    write_json(a.json, {"machine": machine(), "args": vars(a), "policy": policy_rows,
                        "collector": collector_rows})


if __name__ == "__main__":
    main()
