"""Env instances given to Dreamer (`Dreamer(MyEnv())`) as env ids a config can hold.

An instance is kept as a pristine deep copy under an id `lucid.instance:<n>_<Class>`; every
env made from it (the start-up check's, the training env's, each evaluation env's) is a fresh
deep copy of it as it was given, never reset, stepped or closed. The id does not outlive its
process: a run on an instance continues from Python with the instance given again. Runs saved
before this module existed name instances `lucid.api:_env_instance_<n>_<Class>`, which is
recognized too.
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym

PREFIX = "lucid.instance:"
_OLD_PREFIX = "lucid.api:_env_instance_"
_ENVS: dict[str, gym.Env] = {}  # id -> the pristine copy


def is_instance(env_id: str) -> bool:
    """Whether `env_id` names an env instance (of this process or, saved, of another)."""
    return env_id.startswith((PREFIX, _OLD_PREFIX))


def label(env_id: str) -> str:
    """An instance's class name (`lucid.instance:3_CartPoleEnv` -> `CartPoleEnv`)."""
    rest = env_id[len(PREFIX if env_id.startswith(PREFIX) else _OLD_PREFIX):]
    return rest.partition("_")[2] or env_id


def register(env: gym.Env) -> str:
    """Keep a deep copy of `env` (the caller's object is never used or closed); its id."""
    env_id = f"{PREFIX}{len(_ENVS)}_{type(env.unwrapped).__name__}"
    _ENVS[env_id] = copy.deepcopy(env)
    return env_id


def adopt(env_id: str, env: gym.Env) -> None:
    """The instance registered as `env_id` in another process, here too (env_fn sends it)."""
    _ENVS.setdefault(env_id, env)


def get(env_id: str) -> gym.Env | None:
    """The pristine instance of `env_id`, or None where this process has none."""
    return _ENVS.get(env_id)


def make(env_id: str, render_mode: str | None = None, **kwargs: Any) -> gym.Env:
    """A fresh deep copy of the instance `env_id` names."""
    if env_id not in _ENVS:
        cls = label(env_id)
        raise LookupError(f"this run was trained from Python on an env instance "
                          f"(Dreamer({cls}(...))), which no other process can rebuild; load it "
                          f"with Dreamer.load(path, env={cls}(...))")
    if kwargs:
        raise TypeError(f"env.kwargs {sorted(kwargs)} cannot apply to an env instance, "
                        f"which is copied as it was given: make the instance with them, "
                        f"or pass the env by name ('module.path:EnvClass') with env__kwargs")
    env = copy.deepcopy(_ENVS[env_id])
    if render_mode is not None and env.render_mode != render_mode:
        env.close()
        raise TypeError(f"videos of an env with vector observations need its render() "
                        f"frames, and this env instance was made with render_mode="
                        f"{env.render_mode!r}: make it with render_mode={render_mode!r}, "
                        f"or run without videos (run__videos=False)")
    return env
