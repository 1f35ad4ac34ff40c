"""Scale-out throughput: env steps/s against the number of Ray env runners for a slow env, and
updates/s for 1 vs 2 data-parallel learner processes (gloo) on CPU.

    python benchmarks/scaling.py                               # runners 1 2 4, learners 1 2
    python benchmarks/scaling.py --runners 1 2 4 8 --envs-per-runner 2 --seconds 20
    python benchmarks/scaling.py --env dmc-vision:walker-walk --runners 1 2 --skip-learners
    python benchmarks/scaling.py --skip-runners --size XS --batch 16 --length 64

Runners: `benchmarks.scaling:SlowEnv` sleeps `--sleep-ms` (5 ms) per step, like a simulator
that runs at 200 steps/s on one core; `--env` takes any lucid env name instead (a pixel env,
say). Each runner acts with its own copy of the (nano by default) policy on CPU, so this is
the rate at which a learner receives chunks (replay insertion included), with no training in
the way: the learner-side loop only collects (`RayCollector.collect`). The `local` row is the
same env stepped `envs_per_runner` at a time in one process, the baseline of `runners=local`.

Learners: G processes (fork, gloo on localhost) each train on its own synthetic batch of B
windows and average gradients every update (`lucid.distributed`); reported: updates/s of the
job and windows/s (G·B per update). With G processes on fewer than G free cores they only
share the cores: the cores this process may use are in the JSON (`cpus_allowed`).
Numbers, not asserts; results in benchmarks/results/scaling.json.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


class SlowEnv(gym.Env):
    """A 4-float observation, 2 actions, episodes of 200 steps; every step sleeps `sleep_ms`."""

    def __init__(self, sleep_ms: float = 5.0, length: int = 200):
        self.observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.sleep, self.length, self.t = sleep_ms / 1000.0, length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action):
        time.sleep(self.sleep)
        self.t += 1
        obs = self.np_random.uniform(-1, 1, 4).astype(np.float32)
        return obs, float(action), False, self.t >= self.length, {}


# --------------------------------------------------------------------------- runners


def runner_throughput(env_id, env_kwargs, runners: int, per_runner: int, chunk: int,
                      seconds: float, size: str) -> dict:
    from lucid.agent import Agent
    from lucid.config import make_config
    from lucid.ray_runners import RayCollector
    from lucid.replay import Replay, ReplayGroup
    from lucid.envs.checks import spaces_of
    cfg = make_config("default", env={"id": env_id, "kwargs": env_kwargs},
                      model={"size": size},
                      run={"runners": "ray", "num_runners": runners,
                           "envs_per_runner": per_runner, "runner_chunk": chunk,
                           "ray_num_cpus": max(runners, 1)})
    obs_spec, act_spec = spaces_of(cfg)
    agent = Agent(obs_spec, act_spec, cfg, "cpu")
    replay = ReplayGroup([Replay.for_spaces(obs_spec, act_spec.dim, 200_000, per_runner,
                                            seed=i) for i in range(runners)])
    col = RayCollector(cfg, seed=0)
    try:
        t0 = time.time()
        col.collect(agent, replay)  # starts Ray and the runners; first chunk
        while len(replay) < 2 * runners * per_runner * chunk:  # every runner warmed up
            col.collect(agent, replay)
        startup = time.time() - t0
        steps, t0 = 0, time.time()
        while time.time() - t0 < seconds:
            n, _ = col.collect(agent, replay)
            steps += n
        dt = time.time() - t0
        m = col.metrics()
    finally:
        col.close()
    return {"runners": runners, "envs_per_runner": per_runner, "env_steps": steps,
            "seconds": round(dt, 2), "env_steps_per_s": round(steps / dt, 1),
            "startup_s": round(startup, 1),
            "learner_wait_fraction": round(m["runners/learner_wait_fraction"], 3)}


def local_throughput(env_id, env_kwargs, per_runner: int, seconds: float, size: str) -> dict:
    from lucid.agent import Agent
    from lucid.config import make_config
    from lucid.envs import env_fn
    from lucid.runner import Collector
    from lucid.envs.checks import spaces_of
    cfg = make_config("default", env={"id": env_id, "kwargs": env_kwargs}, model={"size": size})
    obs_spec, act_spec = spaces_of(cfg)
    agent = Agent(obs_spec, act_spec, cfg, "cpu")
    col = Collector([env_fn(env_id, None, **env_kwargs)] * per_runner, obs_spec, act_spec)
    try:
        for _ in range(5):
            col.step(agent)
        steps, t0 = 0, time.time()
        while time.time() - t0 < seconds:
            col.step(agent)
            steps += col.n
        dt = time.time() - t0
    finally:
        col.close()
    return {"runners": "local", "envs_per_runner": per_runner, "env_steps": steps,
            "seconds": round(dt, 2), "env_steps_per_s": round(steps / dt, 1)}


# --------------------------------------------------------------------------- learners


def _learner(rank, world, port, args, queue):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(args.threads)
    from train_step import batch_for, spaces
    from lucid.agent import Agent
    from lucid.config import make_config
    cfg = make_config("default", model={"size": args.size},
                      train={"batch_size": args.batch, "batch_length": args.length})
    obs_spec, act_spec = spaces("vector", "discrete")
    torch.manual_seed(rank)
    agent = Agent(obs_spec, act_spec, cfg, "cpu")
    dp = None
    if world > 1:
        from lucid.distributed import DataParallel
        dp = DataParallel("cpu")
        dp.attach(agent)
    batch = batch_for(obs_spec, act_spec, args.batch, args.length, "cpu")
    for _ in range(args.warmup):
        agent.train_step(batch)
    n, t0 = 0, time.time()
    while time.time() - t0 < args.seconds:
        agent.train_step(batch)
        n += 1
    if dp is not None:  # the slowest rank sets the pace: every rank did the same updates
        n = int(dp.sum(n)) // world
        dp.check_identical(agent)
        dp.close()
    queue.put((rank, n, time.time() - t0))


def learner_throughput(world: int, args) -> dict:
    import torch.multiprocessing as mp
    ctx = mp.get_context("fork")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = ctx.Queue()
    procs = [ctx.Process(target=_learner, args=(r, world, port, args, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    out = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    _, n, dt = min(out)
    return {"learners": world, "batch_per_learner": args.batch, "length": args.length,
            "size": args.size, "updates": n, "seconds": round(dt, 2),
            "updates_per_s": round(n / dt, 2),
            "windows_per_s": round(n * world * args.batch / dt, 1)}


# --------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="benchmarks.scaling:SlowEnv")
    ap.add_argument("--sleep-ms", type=float, default=5.0)
    ap.add_argument("--runners", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--envs-per-runner", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--policy-size", default="nano")
    ap.add_argument("--learners", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--size", default="nano", help="learner model size")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per learner")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--skip-runners", action="store_true")
    ap.add_argument("--skip-learners", action="store_true")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "scaling.json"))
    args = ap.parse_args()
    from common import machine, write_json

    kwargs = {"sleep_ms": args.sleep_ms} if args.env.endswith(":SlowEnv") else {}
    runner_rows, learner_rows = [], []
    if not args.skip_learners:  # first: forks before Ray starts any threads
        for g in args.learners:
            learner_rows.append(learner_throughput(g, args))
            print(learner_rows[-1], flush=True)
    if not args.skip_runners:
        runner_rows.append(local_throughput(args.env, kwargs, args.envs_per_runner,
                                            args.seconds, args.policy_size))
        print(runner_rows[-1], flush=True)
        for n in args.runners:
            runner_rows.append(runner_throughput(args.env, kwargs, n, args.envs_per_runner,
                                                 args.chunk, args.seconds, args.policy_size))
            print(runner_rows[-1], flush=True)

    print(f"\nenv runners ({args.env}, {kwargs or ''} policy {args.policy_size}):")
    print(f"{'runners':>8} {'envs/runner':>11} {'env steps/s':>12} {'startup s':>10}")
    for r in runner_rows:
        print(f"{r['runners']!s:>8} {r['envs_per_runner']:>11} {r['env_steps_per_s']:>12} "
              f"{r.get('startup_s', ''):>10}")
    print(f"\nlearners (size {args.size}, B={args.batch} per learner, T={args.length}):")
    print(f"{'learners':>8} {'updates/s':>10} {'windows/s':>10}")
    for r in learner_rows:
        print(f"{r['learners']:>8} {r['updates_per_s']:>10} {r['windows_per_s']:>10}")
    payload = {"machine": {**machine(), "cpus_allowed": sorted(os.sched_getaffinity(0)),
                           "loadavg": os.getloadavg()},
               "args": vars(args), "runners": runner_rows, "learners": learner_rows}
    write_json(args.json, payload)


if __name__ == "__main__":
    main()
