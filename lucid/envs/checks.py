"""Checks of an env against what a run needs, made before any file is written: its spaces,
its first reset and step, each observation against its observation space."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from ..config import Config
from ..warn import warn
from . import env_label, make_env
from ..specs import ActionSpec, ObsSpec


def spaces_of(cfg: Config) -> tuple[ObsSpec, ActionSpec]:
    """The env's observation and action specs, and a check that its first reset and step fit
    them: a custom env's mistakes show here, named, before any file is written."""
    env = make_env(cfg.env.id, cfg.env.max_episode_steps, **cfg.env.kwargs)
    label = env_label(cfg.env.id)
    try:
        spaces = [getattr(env, name, None) for name in ("observation_space", "action_space")]
        if not all(isinstance(s, gym.Space) for s in spaces):
            raise TypeError(f"{label} has no observation_space or action_space (a "
                            f"gymnasium.spaces.Space each); set both in its __init__")
        obs_spec, act_spec = ObsSpec.from_space(spaces[0]), ActionSpec.from_space(spaces[1])
        try:
            out = env.reset(seed=cfg.run.seed)
        except Exception as exc:  # noqa: BLE001 - the env's own
            # A crashing env is the run's to restart (env.max_restarts); no restart helps the
            # reset(self) of gym < 0.26.
            if isinstance(exc, TypeError) and "unexpected keyword argument 'seed'" in str(exc):
                raise TypeError(f"{label}'s reset() takes no seed: gymnasium envs define "
                                f"`def reset(self, *, seed=None, options=None)` and call "
                                f"super().reset(seed=seed) first") from None
            return obs_spec, act_spec
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError(f"{label}'s reset() returned {type(out).__name__}, not "
                            f"(observation, info): gymnasium envs return both")
        if not isinstance(out[1], dict):
            raise TypeError(f"{label}'s reset() returned (observation, "
                            f"{type(out[1]).__name__}); its info must be a dict ({{}} when "
                            f"there is nothing to say)")
        fits(label, obs_spec, spaces[0], out[0], "first observation")
        try:
            out = env.step(spaces[1].sample())
        except Exception:  # noqa: BLE001 - as above
            return obs_spec, act_spec
        if not (isinstance(out, tuple) and len(out) == 5):
            raise TypeError(f"{label}'s step() returned {type(out).__name__} of "
                            f"{len(out) if isinstance(out, tuple) else 1}, not (observation, "
                            f"reward, terminated, truncated, info): gymnasium envs return five")
        fits(label, obs_spec, spaces[0], out[0], "observation after step()")
        reward, flags = np.asarray(out[1]), [np.asarray(f) for f in out[2:4]]
        real = reward.dtype == bool or np.issubdtype(reward.dtype, np.integer) \
            or np.issubdtype(reward.dtype, np.floating)  # a bool is 0 or 1, as in gymnasium
        if reward.ndim != 0 or not real:
            raise TypeError(f"{label}'s step() returned the reward {out[1]!r}; it must be "
                            f"one real number")
        if any(f.ndim != 0 or not (f.dtype == bool or np.issubdtype(f.dtype, np.integer)
                                   and int(f) in (0, 1)) for f in flags):
            raise TypeError(f"{label}'s step() returned terminated={out[2]!r}, "
                            f"truncated={out[3]!r}; both must be bools")
        if not isinstance(out[4], dict):  # gymnasium's vector envs merge it as one
            raise TypeError(f"{label}'s step() returned the info {out[4]!r}; it must be a "
                            f"dict ({{}} when there is nothing to say)")
        return obs_spec, act_spec
    finally:
        close_env(env, label)


def fits(env_id: str, spec: ObsSpec, space, obs, what: str) -> None:
    try:
        spec.check(obs)
        spec.convert(obs)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"{env_id}'s {what} does not fit its observation_space {space}: "
                         f"{exc}") from None


def close_env(env, label: str = "the environment") -> None:
    """`env.close()` (an env, or a Collector's envs); an env whose close() raises is told
    in a warning, not an error that would stop a start, lose an evaluation's returns or hide
    the error in flight (everything the env gave is used already)."""
    try:
        env.close()
    except Exception as exc:  # noqa: BLE001 - the env's own close()
        warn(f"{label}'s close() raised {type(exc).__name__}: {exc}; lucid goes on without "
             f"it (fix close(), or leave it out: gymnasium's Env.close does nothing)")
