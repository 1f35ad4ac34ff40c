"""`lucid check ENV`: how lucid sees an environment, and a short random rollout that tries
what training will do with it, before any run starts.

It reports what each observation becomes (image, vector, one-hots), what the actor outputs
for each action (categoricals, a Normal over rescaled Box dimensions) and how it learns,
then takes random actions for a number of steps, each sent the way the actor's are (to
lucid's model space and back, which must land in the action space): every observation passes
the checks that training makes (shape, dtype, NaN/Inf, Discrete ranges; values beyond a Box's
bounds get a note), rewards must be finite numbers, and episodes should end. Finally, for an env without image observations, it asks
for an `rgb_array` frame, which its videos need."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from .behavior import uses_reinforce
from .config import Config
from .envs import ActionSpec, ObsSpec, env_label, make_env
from .specs import leaves
from .envs.checks import fits, spaces_of


def _n(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def _dims(at: slice) -> str:
    return f"model dim {at.start}" if at.stop - at.start == 1 \
        else f"model dims {at.start}..{at.stop - 1}"


def _bounds(low: np.ndarray, high: np.ndarray) -> str:
    if np.all(low == low[0]) and np.all(high == high[0]):
        return f"[{low[0]:g}, {high[0]:g}]"
    pairs = [f"[{lo:g}, {hi:g}]" for lo, hi in zip(low, high)]
    return ", ".join(pairs[:4]) + (f", ... ({len(pairs)} dims)" if len(pairs) > 4 else "")


def describe_obs(spec: ObsSpec) -> list[str]:
    lines = []
    for key in spec.keys():
        shape, dtype = spec.shapes[key], spec.dtypes[key]
        if key in spec.images:
            h, w, c = spec.images[key]
            source = "uint8 pixels" if dtype == np.uint8 \
                else f"{dtype} in [0, {255 / spec.image_scale.get(key, 1.0):g}]"
            lines.append(f"  {key}: image {h}x{w}x{c} ({source}) -> the CNN encoder")
        elif key in spec.discrete:
            sizes = spec.discrete[key]
            lines.append(f"  {key}: {'Discrete' if not shape else 'MultiDiscrete'} -> one-hots "
                         f"of {', '.join(map(str, sizes))} ({sum(sizes)} inputs) -> the MLP "
                         f"encoder")
        else:
            lines.append(f"  {key}: {dtype} {shape} -> {_n(spec.vectors[key], 'float')}, "
                         f"symlog -> the MLP encoder")
    return lines


def describe_actions(spec: ActionSpec, cfg: Config) -> list[str]:
    parts = spec.parts or [((), spec)]
    where = spec.slices() if spec.parts else [slice(0, spec.dim)]
    lines = []
    for (path, part), at in zip(parts, where):
        name = "/".join(map(str, path)) or "action"
        if part.is_discrete:
            what = (f"categorical over {part.discrete[0]} classes" if len(part.discrete) == 1
                    else f"{len(part.discrete)} categoricals over "
                         f"{', '.join(map(str, part.discrete))} classes")
        else:
            what = (f"Normal over {_n(part.low.size, 'dim')} in [-1, 1], rescaled to "
                    f"{_bounds(part.low, part.high)}")
        lines.append(f"  {name}: {what} ({_dims(at)})")
    how = ("REINFORCE" if uses_reinforce(spec, cfg.train)
           else "backprop through the world model (train.continuous_grad=dynamics)")
    lines.append(f"  the actor outputs {_n(spec.dim, 'model dim')} and learns by {how}")
    return lines


def check(cfg: Config, steps: int, echo) -> None:
    """Describe cfg's env through `echo`, then take `steps` random steps (resetting after
    each episode); raises ValueError/TypeError naming the first problem."""
    obs_spec, act_spec = spaces_of(cfg)  # the first reset and step, as a run checks them
    label = env_label(cfg.env.id)
    echo(f"{label}: preset {cfg.preset}, model size {cfg.model.size}")
    echo("observations:")
    for line in describe_obs(obs_spec):
        echo(line)
    echo("actions:")
    for line in describe_actions(act_spec, cfg):
        echo(line)

    env = make_env(cfg.env.id, cfg.env.max_episode_steps, **cfg.env.kwargs)
    try:
        ends, returns, low, high, outside = _rollout(env, obs_spec, act_spec, steps,
                                                     cfg.run.seed, label)
    finally:
        env.close()
    echo(f"random actions, {steps} steps: {_n(ends, 'episode')} ended, rewards in "
         f"[{low:g}, {high:g}]" + (f", mean return {np.mean(returns):g}" if returns else ""))
    if not ends:
        echo(f"note: no episode ended in {steps} random steps; if episodes never end, give "
             f"env.max_episode_steps (a run needs ends to report returns)")
    if outside is not None:
        echo(f"note: the observation of random step {outside} lies beyond its Box's bounds: "
             f"lucid trains on it as it is (vectors go through symlog), but the space is "
             f"wrong about the env")
    echo("videos: " + ("yes (frames from the image observations)" if obs_spec.images
                       else _frames(cfg)))


def _rollout(env, obs_spec: ObsSpec, act_spec: ActionSpec, steps: int, seed: int, label: str):
    """`steps` random steps of `env`, each action through lucid's model space and back;
    returns (episodes ended, their returns, lowest and highest reward, the first step whose
    observation lies beyond a Box's bounds, which a run takes, or None). Raises ValueError
    naming the step of the first problem: an env that raises, an observation that a run
    would refuse, a reward that is not a finite number."""
    batches = gym.vector.utils.batch_space(env.action_space, 1)  # as a vector env's
    batches.seed(seed)
    ends, returns, ret, low, high = 0, [], 0.0, np.inf, -np.inf
    t, what, outside = 0, "reset()", None

    def check_obs(obs):  # the checks a run makes of every observation
        nonlocal outside
        fits(label, obs_spec, env.observation_space, obs, "observation")
        if outside is None and _beyond(env.observation_space, obs):
            outside = t

    try:
        obs, _ = env.reset(seed=seed)
        check_obs(obs)
        for t in range(1, steps + 1):
            what = "step()"
            action = act_spec.item(act_spec.to_env(act_spec.from_env(batches.sample())), 0)
            if not env.action_space.contains(action):
                raise ValueError(f"lucid's action {action!r} for a random one is not in the "
                                 f"action space {env.action_space}")
            obs, reward, term, trunc, _ = env.step(action)
            check_obs(obs)
            reward = float(reward)
            if not np.isfinite(reward):
                raise ValueError(f"the reward is {reward}; rewards must be finite")
            low, high, ret = min(low, reward), max(high, reward), ret + reward
            if term or trunc:
                ends, returns, ret, what = ends + 1, returns + [ret], 0.0, "reset()"
                obs, _ = env.reset()
                check_obs(obs)
    except Exception as exc:  # noqa: BLE001 - named with its step
        raise ValueError(f"{label} at random step {t} ({what}): {type(exc).__name__}: "
                         f"{exc}") from None
    return ends, returns, low, high, outside


def _beyond(space: gym.Space, obs) -> bool:
    """Whether a Box part of `obs` lies beyond its bounds (values only: a float64 array for a
    float32 Box is not beyond them)."""
    for path, leaf in leaves(space):
        if isinstance(leaf, gym.spaces.Box):
            x = np.asarray(ActionSpec._get(obs, path), np.float64)  # the leaf at that path
            if np.any((x < leaf.low) | (x > leaf.high)):
                return True
    return False


def _frames(cfg: Config) -> str:
    """Whether the env renders rgb_array frames (what videos need), in words."""
    try:  # any failure here only means no videos
        env = make_env(cfg.env.id, cfg.env.max_episode_steps, render_mode="rgb_array",
                       **cfg.env.kwargs)
    except Exception as exc:  # noqa: BLE001
        return f"no ({exc})"
    try:
        env.reset(seed=cfg.run.seed)
        frame = env.render()
        frame = None if frame is None else np.asarray(frame)
    except Exception as exc:  # noqa: BLE001
        return f"no (render() raised {type(exc).__name__}: {exc})"
    finally:
        env.close()
    if frame is None or not (frame.ndim == 2 or frame.ndim == 3 and frame.shape[-1] <= 4):
        return (f"no (render() returned {None if frame is None else frame.shape}, not an "
                f"H x W (x C) frame; run.videos=false to skip them)")
    return f"yes ({frame.shape[0]}x{frame.shape[1]} frames)"
