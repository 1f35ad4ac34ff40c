"""Environment construction: one name for every suite.

    CartPole-v1, ALE/Pong-v5, ...   any registered gymnasium id
    atari:Pong                      Atari, the 2023 paper's settings (sticky actions, 108k frames)
    atari100k:Pong                  Atari100k (no sticky actions, 0-29 no-ops, minimal action set)
    dmc:walker-walk                 DeepMind Control, proprioceptive vector, action repeat 2
    dmc-vision:walker-walk          DeepMind Control, 64x64 camera images, action repeat 2
    crafter                         Crafter, 64x64x3 (also crafter:reward, crafter:noreward)
    minigrid:DoorKey-5x5            MiniGrid, 64x64 RGB
    memory-maze:9x9                 Memory Maze, 64x64 RGB
    envpool:Pong-v5                 envpool's C++ envs (Atari with the paper's settings)
    module.path:EnvClass            your own env class, or
    module.path:make_fn             a function returning a gymnasium.Env
    path/to/file.py:EnvClass        the same from a Python file (kept as an absolute path)
    module.path:my/Env-v0           gymnasium's syntax: an id the module registers on import

Suite options go as keyword arguments: `make_env("atari:Pong", gray=True, sticky=0.0)`.
A suite whose optional package is missing raises `MissingExtraError` naming the pip extra.
See docs/environments.md.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import os
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import numpy as np

from ..plugins import file_id, import_attr, import_file, import_module
from . import instances
from .extras import MissingExtraError
from ..specs import ActionSpec, ObsSpec

__all__ = ["make_env", "env_fn", "default_preset", "observation_space", "SUITES", "ObsSpec", "ActionSpec",
           "UnknownEnvError", "MissingExtraError"]


class UnknownEnvError(ValueError):
    pass


# --------------------------------------------------------------------------- suites

def _atari(task, **kw):
    from .atari import make_atari
    return make_atari(task, "atari", **kw)


def _atari100k(task, **kw):
    from .atari import make_atari
    return make_atari(task, "atari100k", **kw)


def _dmc(task, **kw):
    from .dmc import make_dmc
    return make_dmc(task, vision=False, **kw)


def _dmc_vision(task, **kw):
    from .dmc import make_dmc
    return make_dmc(task, vision=True, **kw)


def _crafter(task, render_mode=None, **kw):
    from .crafter import CrafterEnv
    if task not in ("", "reward", "noreward"):
        raise UnknownEnvError(f"unknown Crafter variant {task!r}; use crafter, crafter:reward "
                              f"or crafter:noreward")
    opts = set(inspect.signature(CrafterEnv).parameters) - {"reward", "render_mode"}
    unknown = set(kw) - opts
    if unknown:
        raise TypeError(f"unknown Crafter option(s) {sorted(unknown)}; options: {sorted(opts)}")
    return CrafterEnv(reward=task != "noreward", render_mode=render_mode, **kw)


def _minigrid(task, **kw):
    from .minigrid import make_minigrid
    return make_minigrid(task, **kw)


def _memory_maze(task, **kw):
    from .memory_maze import make_memory_maze
    return make_memory_maze(task, **kw)


def _envpool(task, **kw):
    from .envpool import make_envpool
    return make_envpool(task, **kw)


# prefix -> (builder(task, render_mode=..., **options), preset, pip extra)
SUITES: dict[str, tuple[Callable[..., gym.Env], str, str]] = {
    "atari": (_atari, "atari", "atari"),
    "atari100k": (_atari100k, "atari100k", "atari"),
    "dmc": (_dmc, "dmc-proprio", "dmc"),
    "dmc-vision": (_dmc_vision, "dmc-vision", "dmc"),
    "crafter": (_crafter, "crafter", "crafter"),
    "minigrid": (_minigrid, "default", "minigrid"),
    "memory-maze": (_memory_maze, "default", "memory-maze"),
    "envpool": (_envpool, "default", "envpool"),
}
# Names that need no `:task` part.
_BARE = {"crafter": ""}


def parse_env_id(env_id: str) -> tuple[str | None, str]:
    """`atari:Pong` -> ("atari", "Pong"); `crafter` -> ("crafter", ""); a gymnasium id or
    `module:attr` -> (None, env_id)."""
    if env_id in gym.registry:
        return None, env_id
    if env_id in _BARE:
        return env_id, _BARE[env_id]
    prefix, sep, task = env_id.partition(":")
    if sep and prefix in SUITES:
        if not task and prefix not in _BARE:
            raise UnknownEnvError(f"{env_id!r} names no task; e.g. {prefix}:{_EXAMPLES[prefix]}")
        return prefix, task
    return None, env_id


_EXAMPLES = {"atari": "Pong", "atari100k": "Pong", "dmc": "walker-walk",
             "dmc-vision": "walker-walk", "minigrid": "DoorKey-5x5", "memory-maze": "9x9",
             "envpool": "Pong-v5"}


def default_preset(env_id: str) -> str:
    """The config preset named after the env's domain in the paper: atari, atari100k,
    dmc-proprio, dmc-vision, crafter; default (the paper's settings) otherwise. With no
    preset given, `lucid.device.preset_for` starts from it."""
    try:
        suite, task = parse_env_id(env_id)
    except UnknownEnvError:
        return "default"
    if suite == "envpool":
        from .envpool import is_atari
        if is_atari(task):
            return "atari"  # envpool's Atari ids
    return SUITES[suite][1] if suite else "default"


def observation_space(env_id: str, max_episode_steps: int | None = None,
                      **kwargs: Any) -> gym.Space:
    """The observation space of `env_id`, from one env made and closed."""
    env = make_env(env_id, max_episode_steps, **kwargs)
    try:
        return env.observation_space
    finally:
        env.close()


# --------------------------------------------------------------------------- user envs

def _registered_by(spec: str) -> str | None:
    """gymnasium's `module:EnvId` (as `gym.make` takes it): the gymnasium id that importing
    the module (or file) registers; None where `spec` names one of its attributes."""
    found = file_id(spec)
    name = found[1] if found else spec.partition(":")[2]
    if name.isidentifier():  # an env class or a function (lucid's module:attr)
        return None
    try:
        import_file(found[0]) if found else import_module(spec.partition(":")[0])
    except Exception:  # noqa: BLE001 - _user_env imports it again and names the error
        return None
    if name not in gym.registry:
        close = difflib.get_close_matches(name, list(gym.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UnknownEnvError(f"{spec!r}: importing {spec.rpartition(':')[0]} did not "
                              f"register the gymnasium id {name!r}{hint}")
    return name


def env_label(env_id: str) -> str:
    """How messages and run directory names call an env: an instance given to Dreamer by its
    class's name, any other env by its id."""
    if instances.is_instance(env_id):
        return instances.label(env_id)
    found = file_id(env_id)
    if found is not None:  # my_env.py:MyEnv, not the whole absolute path
        return f"{Path(found[0]).name}:{found[1]}"
    return env_id


def _takes(fn, kwargs: dict) -> bool:
    """Whether `fn`'s signature takes these keyword arguments (True where it cannot tell)."""
    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError:
        return False
    except ValueError:  # no signature to read
        return True
    return True


def _user_env(spec: str, **kwargs) -> gym.Env:
    try:
        obj = import_attr(spec)
    except (ImportError, AttributeError, ValueError) as exc:
        if isinstance(exc, MissingExtraError):
            raise
        suites = ", ".join(f"{p}:" for p in SUITES)
        module = spec.partition(":")[0]
        missing = getattr(exc, "name", None) or ""
        if isinstance(exc, ModuleNotFoundError) and missing \
                and not (module + ".").startswith(missing + "."):
            raise UnknownEnvError(  # found the env's module: one of its imports is missing
                f"cannot load environment {spec!r}: it imports {missing!r}, which is not "
                f"installed in this environment (pip install it; {exc})") from exc
        if isinstance(exc, ModuleNotFoundError) and file_id(spec) is None:
            exc = f"{exc} (modules are imported from the current directory and PYTHONPATH: " \
                  f"run from the directory that holds it, add that to PYTHONPATH, or name " \
                  f"the file: path/to/file.py:EnvClass)"
        raise UnknownEnvError(f"cannot load environment {spec!r}: {exc}; use "
                              f"`module.path:EnvClass`, `module.path:make_fn` or "
                              f"`path/to/file.py:EnvClass`, or a suite prefix ({suites})"
                              ) from None
    if not callable(obj):
        raise UnknownEnvError(f"{spec!r} is a {type(obj).__name__}, not an env class or a "
                              f"function that returns an env")
    try:
        env = obj(**kwargs)
    except TypeError as exc:
        if "render_mode" in kwargs and not _takes(obj, kwargs):
            raise TypeError(f"{spec} does not take render_mode, which videos need: give it a "
                            f"render_mode=None argument and return frames from render() when "
                            f"it is 'rgb_array' (gymnasium's convention), or run without "
                            f"videos (run.videos=false, no --video)") from None
        raise
    if not isinstance(env, gym.Env):
        raise UnknownEnvError(f"{spec!r} returned {type(env).__name__}, not a gymnasium.Env")
    return env


# --------------------------------------------------------------------------- entry points

def make_env(env_id: str, max_episode_steps: int | None = None, render_mode: str | None = None,
             **options: Any) -> gym.Env:
    """Build one environment from a name (see the module docstring). `options` are the
    suite's settings (e.g. `gray=True` for Atari) or keyword arguments of a user's env."""
    if render_mode == "rgb_array":  # off-screen frames: pygame needs no display (headless)
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    if instances.is_instance(env_id):
        try:
            env = instances.make(env_id, render_mode=render_mode, **options)
        except LookupError as exc:
            raise UnknownEnvError(str(exc)) from None
        return gym.wrappers.TimeLimit(env, max_episode_steps) if max_episode_steps else env
    suite, task = parse_env_id(env_id)
    if suite is not None:
        builder = SUITES[suite][0]
        env = builder(task, render_mode=render_mode, **options)
        if max_episode_steps:
            env = gym.wrappers.TimeLimit(env, max_episode_steps)
        if suite == "crafter":  # outermost, so that it sees time-limit ends too
            from .crafter import EpisodeAchievements
            env = EpisodeAchievements(env)
        return env
    kwargs = dict(options)
    if render_mode:
        kwargs["render_mode"] = render_mode
    if ":" in env_id and env_id not in gym.registry:
        registered = _registered_by(env_id)
        if registered is None:
            env = _user_env(env_id, **kwargs)
            if max_episode_steps:
                env = gym.wrappers.TimeLimit(env, max_episode_steps)
            return env
        env_id = registered  # imported, so registered: gym.make below
    if env_id.startswith("ALE/") and env_id not in gym.registry:
        from .atari import _register
        _register()
    if env_id not in gym.registry:
        name = env_id.rpartition("-v")[0] or env_id
        versions = [k for k in gym.registry if k.rpartition("-v")[0] == name]  # Taxi-v3 -> v4
        close = versions or difflib.get_close_matches(env_id, list(gym.registry), n=3,
                                                      cutoff=0.6)
        if not close and "." in env_id:  # my_pkg.envs.MyEnv for my_pkg.envs:MyEnv
            module, _, attr = env_id.rpartition(".")
            try:
                import_attr(f"{module}:{attr}")
                close = [f"{module}:{attr}"]
            except Exception:
                pass
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UnknownEnvError(f"unknown environment {env_id!r}{hint} (any registered gymnasium "
                              f"id, a suite such as atari:Pong or dmc:walker-walk, or "
                              f"`module.path:EnvClass` for your own env)")
    if max_episode_steps:
        kwargs["max_episode_steps"] = max_episode_steps
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.DependencyNotInstalled as exc:  # e.g. Box2D envs without box2d
        raise ImportError(f"{env_id} needs a package that is not installed: "
                          f"{' '.join(str(exc).split())}") from None
    except ModuleNotFoundError as exc:  # e.g. gymnasium's tabular/ and phys2d/ envs: jax
        raise ImportError(f"{env_id} needs the package {exc.name!r}, which is not installed "
                          f"(pip install {exc.name})") from None


def episode_metrics(env_id: str):
    """A tracker of the suite's own metrics of finished episodes for the training log
    (`update(info)` per step, `metrics()` per row, `state_dict()` in checkpoints): Crafter's
    success rates and score. It counts any env whose infos carry Crafter's
    `episode_achievements` (a wrapped Crafter too) and logs nothing for the others."""
    from .crafter import AchievementTracker
    return AchievementTracker()


def env_info(info: dict, i: int) -> dict:
    """Env `i`'s entries of a vector env's batched info (those its `_key` masks mark)."""
    out = {}
    for k, v in info.items():
        mask = info.get(f"_{k}")
        if k.startswith("_") or (mask is not None and not mask[i]):
            continue
        try:
            v = env_info(v, i) if isinstance(v, dict) else v[i]
        except (TypeError, IndexError, KeyError):  # not batched as gymnasium batches infos
            continue
        out[k] = v.item() if isinstance(v, np.generic) else v
    return out


def env_fn(env_id: str, max_episode_steps: int | None = None, **options: Any
           ) -> Callable[[], gym.Env]:
    """A picklable zero-argument constructor (for vector envs, also AsyncVectorEnv). An env
    instance given to Dreamer travels with it: a process started without fork (spawn,
    forkserver: macOS, Windows, Python 3.14's default on Linux) cannot look it up."""
    instance = instances.get(env_id) if instances.is_instance(env_id) else None
    if instance is not None:
        return functools.partial(_from_instance, env_id, instance, max_episode_steps, options)
    return functools.partial(make_env, env_id, max_episode_steps, **options)


def _from_instance(env_id: str, instance: gym.Env, max_episode_steps, options) -> gym.Env:
    instances.adopt(env_id, instance)  # in a spawned process: the instance is registered there too
    return make_env(env_id, max_episode_steps, **options)
