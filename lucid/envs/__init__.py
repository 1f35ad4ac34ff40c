"""Environment construction. `make_env(id)` accepts any registered gymnasium id, or
`module.path:EnvClass` / `module.path:make_fn` for a user's own environment."""

from __future__ import annotations

import difflib
import importlib
from typing import Callable

import gymnasium as gym

from .spaces import ActionSpec, ObsSpec

__all__ = ["make_env", "env_fn", "ObsSpec", "ActionSpec", "UnknownEnvError"]


class UnknownEnvError(ValueError):
    pass


def _user_env(spec: str, **kwargs) -> gym.Env:
    module, _, name = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise UnknownEnvError(f"cannot load environment {spec!r}: {exc}; use "
                              f"`module.path:EnvClass` or `module.path:make_fn`") from None
    env = obj(**kwargs)
    if not isinstance(env, gym.Env):
        raise UnknownEnvError(f"{spec!r} returned {type(env).__name__}, not a gymnasium.Env")
    return env


def make_env(env_id: str, max_episode_steps: int | None = None, render_mode: str | None = None
             ) -> gym.Env:
    """Build one environment from a name (see the module docstring)."""
    kwargs = {"render_mode": render_mode} if render_mode else {}
    if ":" in env_id and env_id not in gym.registry:
        env = _user_env(env_id, **kwargs)
        if max_episode_steps:
            env = gym.wrappers.TimeLimit(env, max_episode_steps)
        return env
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UnknownEnvError(f"unknown environment {env_id!r}{hint} (any registered gymnasium "
                              f"id works, or `module.path:EnvClass` for your own env)")
    if max_episode_steps:
        kwargs["max_episode_steps"] = max_episode_steps
    return gym.make(env_id, **kwargs)


def env_fn(env_id: str, max_episode_steps: int | None = None) -> Callable[[], gym.Env]:
    return lambda: make_env(env_id, max_episode_steps)
