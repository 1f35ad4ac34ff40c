"""The parts of a run that a learning Trainer and a run loaded to act both build: the
process's settings, the replay, and (to learn) the collector of new experience."""

from __future__ import annotations

import os

from pathlib import Path

import torch

from .agents import replay_fields
from .config import Config, ConfigError
from .envs import env_fn
from .plugins import resolve_id
from .replay import Replay, ReplayGroup
from .runner import Collector, restarting
from .seeds import collector_seed, rank_seed, replay_part_seed, seed_everything
from .system import tune_malloc

VIEW_STEPS = 2**15  # replay steps a run loaded to act (eval, dream) holds


def resolve_ids(cfg: Config) -> None:
    """path/to/file.py:Env and :Class ids, resolved from the working directory."""
    cfg.env.id = resolve_id(cfg.env.id)
    cfg.model.agent = resolve_id(cfg.model.agent)


def default_threads() -> int:
    """`run.threads=0`: half the cores this process may use, at least 1, and no more than
    torch would take. Every thread of an update waits for the slowest at each of its many
    small parallel operations, so threads that must share their cores with another busy
    process slow an update many times over; half the cores leaves room for the rest of the
    machine (measured: docs/performance.md, benchmarks/threads.py)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(torch.get_num_threads(), cores // 2))


def set_up_process(cfg: Config, rank: int) -> None:
    """Threads, the allocator and the random streams of this process (rank `rank`)."""
    torch.set_num_threads(cfg.run.threads or default_threads())
    if cfg.run.tune_malloc:
        tune_malloc()
    seed_everything(rank_seed(cfg.run.seed, rank))


def new_counters() -> dict:
    return {"env_steps": 0, "updates": 0, "episodes": 0, "wall_time": 0.0,
            "nonfinite_updates": 0, "env_restarts": 0}


def _check_windows(cfg: Config, short: int) -> None:
    """Refuse a replay that could never give a window of train.batch_length."""
    t = cfg.train
    if short >= t.window:
        return
    streams = (f"{cfg.run.num_runners} runners x {cfg.run.envs_per_runner} envs"
               if cfg.run.runners == "ray" else f"env.num_envs={cfg.env.num_envs}")
    cap = f", train.replay_max_gb={t.replay_max_gb}" if t.replay_max_gb else ""
    raise ConfigError(
        f"the replay keeps {short} steps per env stream (train.replay_capacity="
        f"{t.replay_capacity:,}{cap}, {streams}), fewer than train.batch_length="
        f"{t.batch_length}" + (" + train.replay_context" if t.replay_context else "") +
        ", so no update could ever run: raise train.replay_capacity or "
        "train.replay_max_gb, or use fewer envs")


def make_replay(cfg: Config, obs_spec, act_spec, run_dir: Path | None, rank: int = 0,
                learn: bool = True, build: bool = True):
    """One Replay over env.num_envs streams, or with Ray runners a ReplayGroup with one part
    per runner. Data-parallel ranks > 0 keep theirs in replay-rank<r>/. A run loaded to act
    (`learn=False`: evaluate, dream) reads its newest VIEW_STEPS into memory and writes
    nothing (a memory-mapped ring may be a live run's). A learning replay that could never
    give a window is refused before anything is built; `build=False` checks that only."""
    t = cfg.train
    directory = None if run_dir is None else \
        run_dir / ("replay" if rank == 0 else f"replay-rank{rank}")
    seed = rank_seed(cfg.run.seed, rank)
    capacity = t.replay_capacity if learn else min(t.replay_capacity, VIEW_STEPS)
    kw = dict(chunk_length=t.replay_chunk, memmap=t.replay_memmap and learn)
    max_bytes = int(t.replay_max_gb * 2**30)
    if cfg.run.runners != "ray":  # (capacity, envs, seed, directory, max bytes) per part
        parts = [(capacity, cfg.env.num_envs, seed, directory, max_bytes)]
    else:
        n = cfg.run.num_runners
        parts = [(capacity // n, cfg.run.envs_per_runner, replay_part_seed(seed, i),
                  directory and directory / f"runner-{i}", max_bytes // n) for i in range(n)]
    fields = Replay.space_fields(obs_spec, act_spec.dim)
    extra = replay_fields(cfg)  # the agent's own (latents), zeros where none was stored
    fields.update(extra)
    kw["optional"] = tuple(extra)
    if learn:
        _check_windows(cfg, min(Replay.steps_per_env(fields, c, e, b)
                                for c, e, _, _, b in parts))
    if not build:
        return None
    replays = [Replay(c, e, fields, s, directory=d, max_bytes=b, **kw)
               for c, e, s, d, b in parts]
    return replays[0] if cfg.run.runners != "ray" else ReplayGroup(replays, seed)


def make_collector(cfg: Config, obs_spec, act_spec, counters: dict, rank: int = 0):
    """The local vector env's Collector, or Ray's env runners, seeded where the run is."""
    seed = collector_seed(cfg.run.seed, counters["updates"], counters["env_steps"], rank)
    if cfg.run.runners == "ray":
        from .ray_runners import RayCollector
        return RayCollector(cfg, seed=seed)
    make = env_fn(cfg.env.id, cfg.env.max_episode_steps, **cfg.env.kwargs)
    fns = [restarting(make, cfg.env.max_restarts)] * cfg.env.num_envs
    return Collector(fns, obs_spec, act_spec, cfg.env.asynchronous, seed=seed)
