"""`lucid repro`: train a preset on one task over several seeds, side by side, then set the
runs beside the authors' published curves (lucid.reference).

Each seed is its own `lucid train` process in OUT/seed-S (its log in OUT/seed-S.log), so a
seed that crashes costs only itself and every run directory is an ordinary one: it can be
resumed, reported or compared again later. A seed whose directory already holds a checkpoint
is resumed up to the budget instead of started again, so a reproduction can be carried over
several sessions (or machines: copy the directories) and compared the same way.

Processes sharing one GPU take turns on it; on a CPU they share its cores, so each gets
`run.threads = cores // parallel` (at least 1) unless the overrides set it. With `batched`,
all seeds train in one `lucid train --seeds` process instead (lucid.multiseed: one batched
update for all), logging to OUT/seeds.log.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from . import reference
from .checkpoint import list_checkpoints
from .config import RESUME_SETTABLE
from .seeds import SEED_DIR, seed_dirs


def seed_command(env: str, preset: str | None, steps: int, seed: int, run_dir: Path,
                 overrides: Sequence[str] = ()) -> list[str]:
    """The `lucid train` command line of one seed: a new run, or the resume of one that has a
    checkpoint (then only the keys a resume may change are passed on)."""
    base = [sys.executable, "-m", "lucid", "train"]
    if list_checkpoints(run_dir):
        kept = [o for o in overrides if o.split("=")[0] in RESUME_SETTABLE]
        return base + ["--resume", str(run_dir), "--steps", str(steps), *kept]
    return base + [env, *(["--preset", preset] if preset else []), "--steps", str(steps),
                   "--seed", str(seed), "--run-dir", str(run_dir), *overrides]


def batched_command(env: str, preset: str | None, steps: int, seeds: Sequence[int],
                    out: Path, overrides: Sequence[str] = ()) -> list[str]:
    """The one `lucid train --seeds` command line of all seeds (`repro(batched=True)`): a new
    multi-seed run in OUT, or the resume of the one there."""
    base = [sys.executable, "-m", "lucid", "train"]
    have = seed_dirs(out)
    if have:
        names = {d.name for d in have}
        want = {SEED_DIR.format(s) for s in seeds}
        if names != want or not all(list_checkpoints(d) for d in have):
            raise ValueError(
                f"{out} holds {', '.join(sorted(names))}; a batched reproduction resumes all "
                f"of its seeds together, which needs --seeds "
                f"{','.join(d.name[len('seed-'):] for d in have)} and a checkpoint in each "
                f"(or run them without --batched, one process per seed)")
        kept = [o for o in overrides if o.split("=")[0] in RESUME_SETTABLE]
        return base + ["--resume", str(out), "--steps", str(steps), *kept]
    return base + [env, *(["--preset", preset] if preset else []), "--steps", str(steps),
                   "--seeds", ",".join(map(str, seeds)), "--run-dir", str(out), *overrides]


def run_seeds(env: str, seeds: Sequence[int], steps: int, out: str | Path,
              preset: str | None = None, overrides: Sequence[str] = (),
              parallel: int | None = None, echo: Callable[[str], None] = print,
              batched: bool = False) -> list[Path]:
    """Train every seed (at most `parallel` at once; default all) and return their run
    directories. A seed that fails is reported with the end of its log; the others go on.
    `batched`: all seeds in one process (`lucid train --seeds`), their updates batched."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if batched:
        return _run_batched(env, seeds, steps, out, preset, overrides, echo)
    parallel = max(1, min(parallel or len(seeds), len(seeds)))
    overrides = list(overrides)
    if not any(o.startswith("run.threads=") for o in overrides):
        overrides.append(f"run.threads={max(1, (os.cpu_count() or 1) // parallel)}")
    if not any(o.startswith("run.progress=") for o in overrides):
        overrides.append("run.progress=false")  # the logs are files, not terminals
    queue = [(s, out / SEED_DIR.format(s)) for s in seeds]
    running: list[tuple[int, Path, subprocess.Popen, object]] = []
    failed: list[int] = []
    while queue or running:
        while queue and len(running) < parallel:
            seed, run_dir = queue.pop(0)
            cmd = seed_command(env, preset, steps, seed, run_dir, overrides)
            log = open(out / f"seed-{seed}.log", "a")
            echo(f"seed {seed}: {' '.join(cmd[1:])}  (log: {out / f'seed-{seed}.log'})")
            running.append((seed, run_dir, subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL), log))
        time.sleep(0.5)
        for item in list(running):
            seed, run_dir, proc, log = item
            if proc.poll() is None:
                continue
            running.remove(item)
            log.close()
            if proc.returncode:
                failed.append(seed)
            _said_done(echo, f"seed {seed}", proc.returncode, out / f"seed-{seed}.log")
    return [d for s, d in ((s, out / SEED_DIR.format(s)) for s in seeds)
            if (d / "episodes.jsonl").exists()]


def _said_done(echo, what: str, code: int, log_path: Path) -> None:
    """Say that a seed's process ended: done, or failed with the end of its log."""
    if code:
        tail = log_path.read_text().splitlines()[-5:]
        echo(f"{what} failed (exit {code}); its log ends:\n  " + "\n  ".join(tail))
    else:
        echo(f"{what} done")


def _run_batched(env, seeds, steps, out: Path, preset, overrides, echo) -> list[Path]:
    overrides = list(overrides)
    if not any(o.startswith("run.progress=") for o in overrides):
        overrides.append("run.progress=false")  # the log is a file, not a terminal
    cmd = batched_command(env, preset, steps, seeds, out, overrides)
    log_path = out / "seeds.log"
    echo(f"seeds {','.join(map(str, seeds))}: {' '.join(cmd[1:])}  (log: {log_path})")
    with open(log_path, "a") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL).returncode
    _said_done(echo, "the seeds' run", code, log_path)
    return [d for d in seed_dirs(out) if (d / "episodes.jsonl").exists()]


def repro(env: str | None = None, seeds: Sequence[int] = (0, 1), steps: int | None = None,
          out: str | Path = "repro", preset: str | None = None,
          overrides: Sequence[str] = (), parallel: int | None = None,
          run_dirs: Sequence[str | Path] = (), year: str = "2023",
          at: Sequence[int] | None = None, echo: Callable[[str], None] = print,
          batched: bool = False) -> dict:
    """Train `env` over `seeds` (unless only `run_dirs` are given), then compare every run
    with the authors' curves; writes repro.json, repro.md and repro.png to `out`."""
    runs = [Path(d) for d in run_dirs]
    if env is not None:
        reference.task_names(env)  # no curves for this env: say so before training
        if steps is None:
            raise ValueError("give the env steps to train each seed for (--steps)")
        runs += run_seeds(env, seeds, steps, out, preset, overrides, parallel, echo, batched)
    if not runs:
        raise ValueError("nothing to compare: give an env to train, or run directories")
    result = reference.compare(runs, year=year, steps=at)
    paths = reference.write(result, out)
    result["files"] = {k: str(v) for k, v in paths.items()}
    return result
