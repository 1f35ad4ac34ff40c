"""Collect experience from a gymnasium vector environment into the replay.

Step convention (see world_model.py): the record of step t holds obs[t], the action taken after
seeing it, the reward and termination of arriving at obs[t], and `is_first`/`is_last`. With
gymnasium's next-step autoreset, the call after an episode's last step returns the next
episode's first observation; that record gets `is_first` and reward 0. A time-limit
truncation sets `is_last` without `is_terminal`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import gymnasium as gym
import numpy as np
import torch

from .envs import env_info
from .envs.checks import close_env
from .seeds import EVAL_OFFSET
from .specs import ActionSpec, ObsSpec
from .warn import raised_at, warn


EVAL_MAX_STEPS = 100_000  # per evaluation episode: beyond it the env has no time limit


class EnvError(RuntimeError):
    """The environment kept raising, or gave data that cannot be stored (NaN, wrong shape)."""


class Restarting(gym.Wrapper):
    """Rebuilds the environment when its `step` or `reset` raises, up to `max_restarts` times.
    A failed step ends the episode as a truncation (not terminal) with zero reward at the last
    observation (the rebuilt env is reset by the vector env's autoreset, on the next step, so
    no step joins two envs' observations), and the info carries `env_restarted=True`;
    training goes on."""

    def __init__(self, make: Callable[[], gym.Env], max_restarts: int = 10):
        self._make, self.max_restarts, self.restarts = make, max_restarts, 0
        self._streak = 0  # restarts since the last step that succeeded
        super().__init__(make())

    def _restart(self, exc: Exception, where: str) -> None:
        self.restarts += 1
        self._streak += 1
        if self.restarts > self.max_restarts:
            failed = self._streak - 1  # rebuilt envs that raised before a step succeeded
            which = "the rebuilt env" if failed == 1 else f"each of the last {failed} rebuilt envs"
            hint = "" if failed < 1 else (
                f"; {which} raised before completing a step, so the fault is not transient: "
                f"fix the env (env.max_restarts=0 stops at its first error)")
            at = raised_at(exc)
            raise EnvError(f"the environment raised in {where} more than "
                           f"env.max_restarts={self.max_restarts} times; last error: "
                           f"{type(exc).__name__}: {exc}" + (f" (at {at})" if at else "")
                           + hint) from exc
        # printed, not warned: this runs in AsyncVectorEnv's worker processes too, where
        # lucid's one-line display of its warnings is not installed
        print(f"warning: the environment raised in {where} ({type(exc).__name__}: {exc}); "
              f"restarting it ({self.restarts}/{self.max_restarts})", flush=True)
        try:
            self.env.close()
        except Exception:  # noqa: BLE001 - a broken env may also fail to close
            pass
        self.env = self._make()

    last_obs = None  # the env's last observation, as it gave it (for Collector's messages)

    def reset(self, **kwargs):
        while True:
            try:
                out = self.env.reset(**kwargs)
                self.last_obs = out[0]
                return out
            except Exception as exc:  # noqa: BLE001
                self._restart(exc, "reset")

    def step(self, action):
        try:
            out = self.env.step(action)
        except Exception as exc:  # noqa: BLE001
            self._restart(exc, "step")
            return self.last_obs, 0.0, False, True, {"env_restarted": True}
        self._streak = 0
        self.last_obs = out[0]
        return out


def restarting(make: Callable[[], gym.Env], max_restarts: int) -> Callable[[], gym.Env]:
    return lambda: Restarting(make, max_restarts)


@dataclass
class Episode:
    ret: float
    length: int
    info: dict = field(default_factory=dict)  # the env's info of its last step


class Collection(Protocol):
    """What the training loop collects with: the local vector env (`Collector`) or Ray's
    env runners (`ray_runners.RayCollector`)."""
    n: int  # envs stepped at once
    restarts: int  # env restarts so far

    def collect(self, agent, replay) -> tuple[int, list[Episode]]:
        """New steps into `replay` (`agent=None`: random actions, for the prefill). Returns
        the env steps added and the episodes that finished."""

    def metrics(self) -> dict:
        """The collection's own metrics since the last call, for the metric rows."""

    def close(self) -> None: ...


@dataclass
class Collector:
    env_fns: list[Callable[[], gym.Env]]
    obs_spec: ObsSpec
    act_spec: ActionSpec
    asynchronous: bool = False
    seed: int = 0
    envs: gym.vector.VectorEnv = field(init=False)

    def __post_init__(self):
        cls = gym.vector.AsyncVectorEnv if self.asynchronous else gym.vector.SyncVectorEnv
        self.envs = cls(self.env_fns, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
        self.n = self.envs.num_envs
        self.envs.action_space.seed(self.seed)
        try:
            obs, _ = self.envs.reset(seed=self.seed)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise self._named(exc) from exc
        self.obs = self.obs_spec.convert(obs, (self.n,))
        self.reward = np.zeros(self.n, np.float32)
        self.is_first = np.ones(self.n, bool)
        self.is_last = np.zeros(self.n, bool)
        self.is_terminal = np.zeros(self.n, bool)
        self.state = None
        self.ep_return = np.zeros(self.n)
        self.ep_length = np.zeros(self.n, np.int64)
        self.restarts = 0
        self.info: dict = {}  # the last vector step's info (e.g. Crafter achievements)

    def step(self, agent=None, explore: bool = True) -> tuple[dict, list[Episode]]:
        """One vector step. `agent=None` takes uniformly random actions (prefill).
        Returns the record of the current step (for the replay) and finished episodes."""
        if agent is None:
            env_action = self.envs.action_space.sample()
            model_action = self.act_spec.from_env(env_action)
        else:
            obs = {k: torch.as_tensor(v, device=agent.device) for k, v in self.obs.items()}
            action, self.state = agent.policy(
                obs, self.state, explore, torch.as_tensor(self.is_first, device=agent.device))
            model_action = action.cpu().numpy()
            env_action = self.act_spec.to_env(model_action)
        record = {f"obs/{k}": v for k, v in self.obs.items()}
        record.update(action=model_action, reward=self.reward, is_first=self.is_first,
                      is_last=self.is_last, is_terminal=self.is_terminal)

        finished = []
        for i in np.flatnonzero(self.is_last):  # self.info: that last step's
            finished.append(Episode(float(self.ep_return[i]), int(self.ep_length[i]),
                                    env_info(self.info, i)))
        self.ep_return[self.is_last] = 0.0
        self.ep_length[self.is_last] = 0

        try:
            obs, reward, term, trunc, info = self.envs.step(env_action)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise self._named(exc) from exc
        self.info = info
        if "env_restarted" in info:
            self.restarts += int(np.sum(info.get("_env_restarted", info["env_restarted"])))
        reward = np.asarray(reward, np.float32)
        if not np.all(np.isfinite(reward)):
            raise ValueError("the environment returned a NaN or Inf reward")
        self.is_first = self.is_last.copy()  # next-step autoreset: these envs just reset
        self.obs = self.obs_spec.convert(obs, (self.n,))
        self.reward = np.where(self.is_first, 0.0, reward).astype(np.float32)
        self.is_terminal = np.asarray(term, bool) & ~self.is_first
        self.is_last = (np.asarray(term, bool) | np.asarray(trunc, bool)) & ~self.is_first
        self.ep_return += self.reward
        self.ep_length += ~self.is_first
        return record, finished

    def collect(self, agent, replay) -> tuple[int, list[Episode]]:
        """One vector step into `replay` (`Collection`)."""
        record, finished = self.step(agent)
        latents = getattr(agent, "replay_record", None)  # the Nature recipe's replay context
        if latents is not None:
            record.update(latents(self.state))
        replay.add(record)
        return self.n, finished

    def metrics(self) -> dict:
        return {}  # restarts are counted by the loop (`restarts`)

    def _named(self, exc: Exception) -> Exception:
        """The vector env failed to batch the observations (a wrong shape, dtype or key, in
        numpy's words): the same mistake named by the observation key, from each env's last
        observation where `Restarting` kept it; else the original error."""
        for env in getattr(self.envs, "envs", []):
            obs = getattr(env, "last_obs", None)
            if obs is None:
                continue
            try:
                self.obs_spec.check(obs)
            except (ValueError, KeyError) as named:
                return named
        return exc

    def close(self):
        self.envs.close()


def run_episodes(agent, env_fn: Callable[[], gym.Env], obs_spec: ObsSpec, act_spec: ActionSpec,
                 episodes: int, explore: bool = False, seed: int = EVAL_OFFSET,
                 max_steps: int = EVAL_MAX_STEPS, after_cut: str = "stop",
                 watch: Callable[[int, "Collector"], None] | None = None) -> list[Episode]:
    """The one episode loop (evaluation, videos, the API): `episodes` full episodes of one
    env (one: no bias to short episodes) with the agent's greedy (or sampled) policy, the env
    seeded `seed` once and reset by the vector env between episodes. `watch(i, collector)`
    sees episode i's first observation and each step after it (videos take frames there).

    An episode still running after `max_steps` steps is cut (its return is partial): with
    `after_cut="stop"` the loop ends there with a warning (an env with no time limit), with
    "fresh" the next episode starts in a new env seeded `seed + i`."""
    if after_cut not in ("stop", "fresh"):
        raise ValueError(f"after_cut is 'stop' or 'fresh', got {after_cut!r}")
    col = Collector([env_fn], obs_spec, act_spec, seed=seed)
    done: list[Episode] = []
    try:
        for i in range(episodes):
            if i and col.is_last[0]:  # act on the last observation; the env resets
                col.step(agent, explore=explore)
            elif i:  # the last episode was cut: a fresh env
                close_env(col)
                col = Collector([env_fn], obs_spec, act_spec, seed=seed + i)
            if watch is not None:
                watch(i, col)
            length = 0
            while not col.is_last[0] and length < max_steps:
                col.step(agent, explore=explore)
                length += 1
                if watch is not None:
                    watch(i, col)
            ended = bool(col.is_last[0])
            done.append(Episode(float(col.ep_return[0]), length,
                                env_info(col.info, 0) if ended else {}))
            if not ended and after_cut == "stop":
                warn(f"evaluation stopped after {length:,} steps of episode {i + 1} of "
                     f"{episodes}: this env's episodes do not end; the rest are cut (the "
                     f"last return is partial); give it a time limit "
                     f"(env.max_episode_steps=N)")
                break
    finally:
        close_env(col)
    return done


def evaluate(agent, env_fn: Callable[[], gym.Env], obs_spec: ObsSpec, act_spec: ActionSpec,
             episodes: int, explore: bool = False, seed: int = EVAL_OFFSET) -> list[Episode]:
    """`episodes` full episodes with the agent's greedy (or sampled) policy (`run_episodes`);
    an env whose episode does not end within EVAL_MAX_STEPS steps stops the evaluation with
    a warning: the episodes finished by then are returned, then the cut one."""
    return run_episodes(agent, env_fn, obs_spec, act_spec, episodes, explore, seed,
                        max_steps=EVAL_MAX_STEPS)
