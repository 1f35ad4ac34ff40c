"""Distributed environment runners on Ray (`run.runners=ray`, docs/scaling.md).

`RayCollector` starts `run.num_runners` Ray actors (`EnvRunner`), each stepping
`run.envs_per_runner` envs with its own CPU copy of the policy. A runner steps its envs
`run.runner_chunk` times and returns the chunk; the learner writes it into runner i's part of a
`ReplayGroup` (runner i's env j is stream j of part i) and immediately asks that runner for its
next chunk, sending new weights when the learner has made `run.weight_sync_every` updates since
the runner's last copy. So every runner has exactly one chunk in flight: it collects while the
learner trains, and when the learner is behind the train ratio the runners wait for it
(throttling) -- the learner still makes exactly floor((env steps - prefill) * ratio / (B*T))
updates, counted on the chunks it has received. The policy lag of a chunk (learner updates
when it is received minus the updates of the weights that collected it) is reported as
`runners/policy_lag`.

A runner that dies (its process killed, its node lost, or an exception in it) is replaced by a
new actor with a new seed; the chunk it had in flight is dropped with a log line, its replay
stream goes on with the new runner's first steps (which start new episodes with `is_first`).

Ray is optional: `pip install lucid-rl[ray]`. A local Ray instance is started with
`ray.init()` (no dashboard, workers' logs not forwarded) unless `run.ray_address` names an
existing cluster.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from .agents import agent_class
from .config import from_yaml, to_yaml
from .envs import env_fn
from .envs.checks import spaces_of
from .runner import Collector, EnvError, Episode, restarting
from .seeds import runner_seed
from .warn import warn


def _ray():
    try:
        import ray
    except ImportError as exc:
        raise ImportError("run.runners=ray needs Ray: pip install 'lucid-rl[ray]'") from exc
    return ray


REPEATS_FATAL = 3  # the same task error this many times in a row: not a flaky worker


def _cause(exc: Exception) -> str:
    """What went wrong in a runner: the exception its task raised (a RayTaskError wraps it
    under a header naming the task and process), or its constructor raised (the last line of
    Ray's message), else the Ray error itself."""
    inner = getattr(exc, "cause", None)
    if isinstance(inner, BaseException):
        return f"{type(inner).__name__}: {inner}".strip()
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if getattr(exc, "actor_init_failed", False) and lines:
        return lines[-1]
    return f"{type(exc).__name__}: {exc}".strip()


def _raised(exc: Exception) -> bool:
    """Whether the runner's code raised (its task, or its constructor), as opposed to a
    runner that was killed or lost with its node, which a replacement may well cure."""
    ex = _ray().exceptions
    return isinstance(exc, ex.RayTaskError) or getattr(exc, "actor_init_failed", False)


class EnvRunner:
    """Steps `num_envs` envs with a CPU copy of the policy; becomes a Ray actor."""

    def __init__(self, cfg_yaml: str, index: int, seed: int, num_envs: int):
        torch.set_num_threads(1)
        torch.manual_seed(seed)
        cfg = from_yaml(cfg_yaml)
        self.index = index
        obs_spec, act_spec = spaces_of(cfg)
        # Acting on a CPU copy: compiling is not worth it, and CUDA graphs need a GPU.
        cfg.train.compile = cfg.train.cuda_graph = False
        self.agent = agent_class(cfg)(obs_spec, act_spec, cfg, "cpu")
        make = env_fn(cfg.env.id, cfg.env.max_episode_steps, **cfg.env.kwargs)
        self.collector = Collector([restarting(make, cfg.env.max_restarts)] * num_envs,
                                   obs_spec, act_spec, seed=seed)
        self.version = -1  # learner updates of the weights held (-1: none yet)

    def ping(self) -> int:
        return os.getpid()

    def sample(self, length: int, weights=None, version: int = -1, explore_random=False):
        """Step every env `length` times. `weights` (the world model's and actor's state
        dicts, updates `version`) replace the policy first; `explore_random` takes uniformly
        random actions (prefill). Returns the chunk (fields shaped (num_envs, length, ...)),
        finished episodes (return, length, the env's info of their last step), the weights'
        version and the env restarts so far."""
        if weights is not None:
            self.agent.wm.load_state_dict(weights["world_model"])
            self.agent.actor.load_state_dict(weights["actor"])
            self.version = version
        start = time.time()
        policy = None if explore_random or self.version < 0 else self.agent
        records, episodes = [], []
        latents = getattr(policy, "replay_record", None)  # the Nature recipe's replay context
        for _ in range(length):
            record, finished = self.collector.step(policy)
            if latents is not None:
                record.update(latents(self.collector.state))
            records.append({k: np.array(v) for k, v in record.items()})
            episodes += [(e.ret, e.length, e.info) for e in finished]
        chunk = {k: np.stack([r[k] for r in records], 1) for k in records[0]}
        return {"chunk": chunk, "episodes": episodes,
                "version": self.version if policy is not None else None,
                "restarts": self.collector.restarts, "seconds": time.time() - start}


class RayCollector:
    """The learner's side: runners, their in-flight chunks, weights and restarts. Actors are
    started on the first `collect`, so building a Trainer (e.g. to evaluate) starts nothing."""

    def __init__(self, cfg, seed: int = 0):
        _ray()  # fail early (with the pip extra named) when Ray is not installed
        self.cfg, self.seed = cfg, seed
        r = cfg.run
        self.num_runners, self.per_runner, self.chunk = r.num_runners, r.envs_per_runner, \
            r.runner_chunk
        self.n = self.num_runners * self.per_runner
        self.runners: list = []
        self.inflight: dict = {}  # ObjectRef -> runner index
        self.versions = [-1] * self.num_runners  # updates of the weights each runner holds
        self.env_restarts_seen = [0] * self.num_runners
        self.restarts = 0  # env restarts inside runners (as Collector.restarts)
        self.runner_restarts = 0
        self.dropped_chunks = 0
        self._repeats: tuple[str, int] = ("", 0)  # the last runner error, and how often in a row
        self.started_ray = False
        self._weights = (None, -1)  # (ObjectRef, version) of the newest weights put
        self._lags: list[int] = []
        self._waited = 0.0  # seconds the learner spent waiting for chunks since metrics()
        self._since = time.time()
        self._cfg_yaml = to_yaml(cfg)

    # ------------------------------------------------------------------ actors

    def _init_ray(self):
        ray = _ray()
        if not ray.is_initialized():
            r = self.cfg.run
            kwargs = dict(include_dashboard=False, log_to_driver=False,
                          ignore_reinit_error=True)
            if r.ray_address:
                ray.init(address=r.ray_address, **kwargs)
            else:
                cpus = r.ray_num_cpus or max(1, int(np.ceil(r.num_runners * r.runner_cpus)))
                ray.init(num_cpus=cpus, **kwargs)
            self.started_ray = True
        return ray

    def _start(self, i: int):
        ray = self._init_ray()
        seed = runner_seed(self.seed, i, self.runner_restarts)
        actor = ray.remote(EnvRunner).options(num_cpus=self.cfg.run.runner_cpus,
                                              max_restarts=0)
        return actor.remote(self._cfg_yaml, i, seed, self.per_runner)

    def start(self) -> None:
        if not self.runners:
            self.runners = [self._start(i) for i in range(self.num_runners)]

    def _weights_ref(self, agent):
        ref, version = self._weights
        if version != agent.updates:
            ray = _ray()
            cpu = lambda m: {k: v.detach().cpu() for k, v in m.state_dict().items()}  # noqa
            ref = ray.put({"world_model": cpu(agent.wm), "actor": cpu(agent.actor)})
            self._weights = (ref, agent.updates)
        return ref

    def _submit(self, i: int, agent, explore_random: bool) -> None:
        weights, version = None, -1
        every = self.cfg.run.weight_sync_every
        if agent is not None and (self.versions[i] < 0
                                  or agent.updates - self.versions[i] >= every):
            weights, version = self._weights_ref(agent), agent.updates
            self.versions[i] = agent.updates
        ref = self.runners[i].sample.remote(self.chunk, weights, version,
                                            explore_random or agent is None)
        self.inflight[ref] = i

    def _replace(self, i: int, exc: Exception) -> None:
        ray = _ray()
        self.runner_restarts += 1
        self.dropped_chunks += 1
        cause = _cause(exc)
        last, times = self._repeats
        self._repeats = (cause, times + 1 if cause == last else 1)
        if self.runner_restarts > self.cfg.run.max_runner_restarts:
            raise EnvError(f"Ray env runners died more than run.max_runner_restarts="
                               f"{self.cfg.run.max_runner_restarts} times; last error: "
                               f"{cause}") from exc
        if self._repeats[1] >= REPEATS_FATAL and _raised(exc):
            raise EnvError(f"Ray env runners failed {REPEATS_FATAL} times in a row with the "
                           f"same error, which a new runner does not cure: {cause}") from exc
        warn(f"Ray env runner {i} died ({cause.splitlines()[0][:300]}); its in-flight "
             f"chunk of {self.per_runner}x{self.chunk} steps is dropped and a new runner "
             f"takes its place ({self.runner_restarts}/{self.cfg.run.max_runner_restarts})")
        try:
            ray.kill(self.runners[i])
        except Exception:  # noqa: BLE001 - already gone
            pass
        self.runners[i] = self._start(i)
        self.versions[i] = -1
        self.env_restarts_seen[i] = 0

    # ------------------------------------------------------------------ the trainer's API

    def collect(self, agent, replay) -> tuple[int, list]:
        """Wait for the next finished chunk, store it in `replay` (a ReplayGroup) and give
        that runner its next task. `agent=None` means random actions (prefill). Returns the
        env steps added (0 when the chunk was lost with its runner) and finished episodes."""
        ray = _ray()
        self.start()
        for i in range(self.num_runners):  # every runner keeps one chunk in flight
            if i not in self.inflight.values():
                self._submit(i, agent, agent is None)
        waited = time.time()
        (ref,), _ = ray.wait(list(self.inflight), num_returns=1)
        i = self.inflight.pop(ref)
        self._waited += time.time() - waited
        try:
            out = ray.get(ref)
        except ray.exceptions.RayError as exc:  # the actor died, its task raised, the chunk
            # was lost with its node, the worker crashed: a new runner takes its place
            self._replace(i, exc)
            self._submit(i, agent, agent is None)
            return 0, []
        self._repeats = ("", 0)  # a chunk arrived: earlier errors were not "in a row"
        replay.add_chunk(i, out["chunk"])
        self.restarts += out["restarts"] - self.env_restarts_seen[i]
        self.env_restarts_seen[i] = out["restarts"]
        if out["version"] is not None and agent is not None:
            self._lags.append(agent.updates - out["version"])
        self._submit(i, agent, agent is None)
        return self.per_runner * self.chunk, [Episode(*ep) for ep in out["episodes"]]

    def metrics(self) -> dict:
        """Runner metrics since the last call (for the trainer's metric rows)."""
        row = {"runners/restarts": self.runner_restarts,
               "runners/dropped_chunks": self.dropped_chunks}
        if self._lags:
            row["runners/policy_lag"] = float(np.mean(self._lags))
            row["runners/policy_lag_max"] = float(np.max(self._lags))
        now = time.time()
        row["runners/learner_wait_fraction"] = self._waited / max(now - self._since, 1e-9)
        self._lags, self._waited, self._since = [], 0.0, now
        return row

    def close(self) -> None:
        if not self.runners:
            return
        ray = _ray()
        for actor in self.runners:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001
                pass
        self.runners, self.inflight = [], {}
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False
