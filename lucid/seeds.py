"""Every seed a run derives from `run.seed`, named in one place, so that the streams of
different jobs (ranks, env runners, evaluation, videos) never coincide and a run repeats by
its seed. Numpy's seeds are below 2**32; config.py keeps `run.seed` low enough for these."""

from __future__ import annotations

from pathlib import Path

SEED_DIR = "seed-{}"  # a multi-seed run's seed S: RUN_DIR/seed-S, an ordinary run directory
RANK_STRIDE = 7919  # a prime: data-parallel rank r draws from seed + 7919·r
EVAL_OFFSET = 10_000  # evaluation envs: their own streams, apart from training's
VIDEO_OFFSET = 20_000  # the evaluation episodes of videos


def rank_seed(seed: int, rank: int) -> int:
    """The torch/numpy/random seed of data-parallel rank `rank` (rank 0: `seed` itself)."""
    return seed + RANK_STRIDE * rank


def replay_part_seed(seed: int, part: int) -> int:
    """The sampling seed of part `part` of a replay split over Ray runners."""
    return seed + 1 + part


def collector_seed(seed: int, updates: int, env_steps: int, rank: int) -> int:
    """The envs' and random actions' seed of a (re)started collection: a resumed run's differ
    from its start's, also when it resumes during prefill, before any update."""
    return seed + 1000 * updates + env_steps + RANK_STRIDE * rank


def eval_seed(seed: int, env_steps: int = 0) -> int:
    """The first env seed of an evaluation (the periodic ones: at `env_steps`)."""
    return seed + EVAL_OFFSET + env_steps


def video_seed(seed: int, env_steps: int) -> int:
    """The first env seed of the evaluation episodes filmed at `env_steps`."""
    return seed + VIDEO_OFFSET + env_steps


def runner_seed(seed: int, runner: int, restarts: int) -> int:
    """The seed of Ray env runner `runner` after `restarts` restarts of runners."""
    return seed + 10_007 * (runner + 1) + 1_000_003 * restarts


def seed_everything(seed: int) -> None:
    """Python's, numpy's and torch's global random streams."""
    import random

    import numpy as np
    import torch
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def parse_seeds(text: str) -> list[int]:
    """"0,1,2" or "0-3" or "0-1,5" -> sorted seeds."""
    seeds: set[int] = set()
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        try:
            seeds.update(range(int(lo), int(hi) + 1) if dash else [int(lo)])
        except ValueError:
            raise ValueError(f"--seeds {text!r}: write seeds as 0,1,2 or 0-3") from None
    if not seeds:
        raise ValueError(f"--seeds {text!r} names no seed")
    return sorted(seeds)


def seed_dirs(run_dir: str | Path) -> list[Path]:
    """The seeds' run directories of a multi-seed run (`lucid train --seeds`, `lucid repro`:
    RUN_DIR/seed-S, each with a config.yaml), by seed; [] for any other directory."""
    found = []
    for d in Path(run_dir).glob("seed-*"):
        tail = d.name[len("seed-"):]
        if tail.isdigit() and (d / "config.yaml").is_file():
            found.append((int(tail), d))
    return [d for _, d in sorted(found)]


def not_one_run(run_dir: str | Path) -> str | None:
    """What to say of a multi-seed run's directory given where one run's is needed."""
    seeds = seed_dirs(run_dir)
    if not seeds:
        return None
    return (f"{run_dir} holds the runs of {len(seeds)} seeds (lucid train --seeds): give one "
            f"of them, e.g. {seeds[0]}; lucid plot, lucid report and lucid train --resume "
            f"take the whole directory")
