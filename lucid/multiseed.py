"""`lucid train ENV --seeds 0-7`: several seeds of one config in one process, their updates
batched into one (lucid.batched), so that a GPU that one seed's update leaves mostly idle
trains K seeds in little more than one seed's time.

Each seed is an ordinary run in RUN_DIR/seed-S (its own envs, replay, logs, checkpoints,
config.yaml with run.seed = S), so it can be evaluated, reported, plotted or resumed alone
like any run; `lucid plot RUN_DIR` shows the seeds as one curve with its spread. The seeds
step their envs in lockstep and update together: the loop is Trainer's (train.py), run for K
runs at once, with one batched update where each would make its own.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from . import checkpoint as ckpt
from .batched import BatchedAgents, stack_batches
from .config import Config, ConfigError
from .resume import saved_config
from .rundir import claim_run_dir
from .seeds import SEED_DIR, seed_dirs
from .stops import NonFiniteError, SignalStop, disk_full_error
from .runner import EnvError
from .train import Trainer

def _for_seeds(cfg: Config) -> Config:
    """The config each seed runs: the graph and compile off where the device would choose
    them (the batched update's compiled and graphed forms await a GPU measurement). Set,
    train.compile compiles the batched update as a whole and train.cuda_graph captures it as
    one graph (or each seed's own, where the seeds update in turn: lucid.batched)."""
    t, r = cfg.train, cfg.run
    if cfg.explore.method != "none":
        raise ConfigError(f"--seeds batches the paper's agent; explore.method="
                          f"{cfg.explore.method} trains its seeds as separate runs for now "
                          f"(lucid repro without --batched)")
    if r.runners != "local":
        raise ConfigError("--seeds steps local envs (run.runners=local); Ray runners "
                          "serve one seed per run (docs/scaling.md)")
    return dataclasses.replace(cfg, train=dataclasses.replace(
        t, compile=bool(t.compile), cuda_graph=bool(t.cuda_graph)))


class SeedsTrainer:
    """K Trainers, one per seed, whose updates run as one batched update."""

    def __init__(self, trainers: list[Trainer], run_dir: Path):
        self.trainers = trainers
        self.run_dir = run_dir
        self.batched = BatchedAgents([t.agent for t in trainers])
        self._stopped = [False] * len(trainers)  # each seed: had a reason to stop (_done)

    @classmethod
    def start(cls, cfg: Config, seeds: Sequence[int],
              run_dir: str | Path | None = None) -> "SeedsTrainer":
        """New runs of `cfg` for `seeds` in RUN_DIR/seed-S (RUN_DIR: `run_dir`, else
        run.run_dir, else a fresh one under runs/)."""
        seeds = sorted(set(seeds))
        if not seeds:
            raise ConfigError("--seeds names no seed")
        cfg = _for_seeds(cfg)
        given = run_dir or cfg.run.run_dir
        base = claim_run_dir(Path(given).expanduser() if given else None,
                             dataclasses.replace(cfg, run=dataclasses.replace(
                                 cfg.run, seed=seeds[0])))
        trainers: list[Trainer] = []
        try:
            for i, seed in enumerate(seeds):
                run = dataclasses.replace(cfg.run, seed=seed, run_dir=None,
                                          progress=cfg.run.progress and i == 0)
                trainers.append(Trainer(dataclasses.replace(cfg, run=run),
                                        base / SEED_DIR.format(seed)))
            return cls(trainers, base)
        except BaseException:
            for t in trainers:
                t.close()
            raise

    @classmethod
    def resume(cls, cfg: Config, run_dir: str | Path,
               settings: tuple[str, ...] = ()) -> "SeedsTrainer":
        """The seeds of the multi-seed run in `run_dir`, each resumed from its checkpoint
        (with `cfg`'s run.steps and device and the values of `settings`, as Trainer's)."""
        base = Path(run_dir)
        dirs = seed_dirs(base)
        if not dirs:
            raise ConfigError(f"{base} holds no seed-S run directories: it is not a "
                              f"multi-seed run (resume a single run without --seeds)")
        for d in dirs:  # a config the batched update refuses builds no agent first
            _for_seeds(saved_config(d, set_aside=False)[0])
        trainers: list[Trainer] = []
        try:
            for i, d in enumerate(dirs):
                trainers.append(Trainer(cfg, d, resume=True, settings=settings))
                if i:  # one progress display: the first seed's
                    t = trainers[-1]
                    t.cfg = dataclasses.replace(t.cfg, run=dataclasses.replace(
                        t.cfg.run, progress=False))
            for t in trainers:
                _for_seeds(t.cfg)
            return cls(trainers, base)
        except BaseException:
            for t in trainers:
                t.close()
            raise

    @property
    def seeds(self) -> list[int]:
        return [t.cfg.run.seed for t in self.trainers]

    # ------------------------------------------------------------------ the loop

    def run(self, end_videos: bool = False) -> Path:
        """Train every seed until its run.steps (Trainer.run's loop, for K runs), then
        checkpoint each. A signal, the time limit, or every seed's run.target_return stops
        all seeds together."""
        trainers = self.trainers
        trainers[0]._notes()
        sessions = [t._open_session() for t in trainers]
        with SignalStop(self._on_signal):
            try:
                while not self._done():
                    for t, s in zip(trainers, sessions):
                        t._episodes_ended(s, t._collect_once(), None)
                    self._train_due(sessions)
                    for t, s in zip(trainers, sessions):
                        t._on_schedule(s)
                for t, s in zip(trainers, sessions):
                    t._close_session(s, end_videos)
            except (EnvError, NonFiniteError) as exc:  # one seed's; it saved, the others too
                for t in trainers:
                    t._save_after(exc)
                raise
            except OSError as exc:
                if not ckpt.disk_full(exc):
                    for t in trainers:
                        t._save_after(exc)
                    raise
                t0 = trainers[0]
                raise disk_full_error(exc, self.run_dir, t0.counters["env_steps"],
                                      f"lucid train --resume {self.run_dir}") from None
            except BaseException as exc:
                for t in trainers:
                    t._save_after(exc)
                raise
            finally:
                for t, s in zip(trainers, sessions):
                    t._batches.close()
                    s.logger.close()
        return self.run_dir

    def _done(self) -> bool:
        """Every seed has its steps, or one was signalled, or every seed has had a reason to
        stop (the time limit; its run.target_return, reached once: a seed that reached it
        trains on until the others have)."""
        ts = self.trainers
        if all(t.counters["env_steps"] >= t.cfg.run.steps for t in ts):
            return True
        self._stopped = [was or t._stopping() for was, t in zip(self._stopped, ts)]
        return any(t.signalled is not None for t in ts) or all(self._stopped)

    def _train_due(self, sessions) -> None:
        """The updates the train ratio asks for, of all seeds at once."""
        ts = self.trainers
        while all(t.counters["updates"] < t.updates_due() for t in ts) \
                and all(t._can_sample() for t in ts):
            batches = [t._batches.get() for t in ts]
            # where each seed's steps live (replay context) stays out of the batched update
            where = [{k: b.pop(k) for k in [k for k in b if k.startswith("_")]}
                     for b in batches]
            metrics = self.batched.train_step(stack_batches(batches))
            bad = (metrics["train/nonfinite_steps"] > 0).tolist()
            for k, (t, s) in enumerate(zip(ts, sessions)):
                t._write_latents(where[k])
                t._count_nonfinite(s, bad[k])
                s.rows.add({name: v[k] for name, v in metrics.items()})
                t.counters["updates"] += 1

    def _on_signal(self, signum: int) -> None:
        for t in self.trainers:
            t._on_signal(signum)

    @property
    def signalled(self) -> int | None:
        return self.trainers[0].signalled

    def close(self) -> None:
        for t in self.trainers:
            t.close()
