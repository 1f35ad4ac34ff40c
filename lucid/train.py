"""The training loop (the paper's algorithm box):

    prefill the replay with random actions
    repeat until `run.steps` environment steps:
        step the vector env with the policy, store the step in the replay
        while updates < (env steps since prefill) · train_ratio / (B·T):
            sample B windows of length T, update world model, actor, critic
        log, evaluate and checkpoint on their schedules

The run's state (its directory, agent, replay, collector, counters, checkpoints) is
LearningRun's (learning.py); the other jobs of a run live beside it: device, run directory,
resume, schedule, notes, stops, metric rows and data-parallel ranks.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import checkpoint as ckpt
from . import notes
from .acting import evaluate_agent
from .config import Config
from .learning import LearningRun
from .logger import Logger
from .replay import Prefetcher
from .rows import MetricRows
from .runner import EnvError
from .schedule import Every
from .seeds import eval_seed
from .stops import DiskFullError, NonFiniteError, SignalStop, disk_full_error, early_stop
from .warn import note, warn

__all__ = ["Trainer", "train", "DiskFullError", "EnvError", "NonFiniteError"]


class _QuietLogger:
    """Data-parallel ranks > 0 log nothing: every Logger method is a no-op here."""
    tb = None

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


@dataclass
class _Session:
    """The loop state of one `Trainer.run` call: its logger, clocks, schedules and the
    metrics summed since the last row."""
    logger: Logger | _QuietLogger
    start: float  # wall-clock origin: wall_time goes on across resumes
    rows: MetricRows
    last_ckpt: float
    last_ckpt_steps: int
    evals: Every  # evaluations and videos, every run.eval_every / run.video_every steps
    videos: Every
    endless_noted: bool  # said (or no need to say) that no episode has ended
    first_ckpt: bool  # a run without updates yet checkpoints after its first ones
    bad_in_row: int = 0  # updates in a row with non-finite losses or gradients


class Trainer(LearningRun):
    """The loop of one run directory (its state: LearningRun). `Trainer(cfg)` starts a new
    run, `Trainer(cfg, run_dir, resume=True)` goes on with a saved one."""

    stop_requested = False  # by a signal or the callback, in the last run()
    signalled: int | None = None  # SIGINT / SIGTERM that stopped the last run()
    stop_reason: str | None = None  # why the last run() ended before run.steps
    videos_logged_at: int | None = None  # env steps of the last periodic videos
    _sampling = False  # the replay holds a window (on every rank): _can_sample

    # ------------------------------------------------------------------ loop

    def updates_due(self, env_steps: int | None = None) -> int:
        """Updates that the env steps so far (or `env_steps`) call for (`Ratio`)."""
        return self.ratio.due(self.counters["env_steps"] if env_steps is None else env_steps)

    def run(self, callback=None, end_videos: bool = False) -> Path:
        """Train until `run.steps` env steps (or the time limit, the target return, SIGINT /
        SIGTERM, or `callback(info)` returning False (or 0, np.False_; not None) after an
        episode), then checkpoint. `end_videos`: then also an evaluation episode's and a
        dream's video (videos/, TensorBoard, W&B), unless a signal stopped the run."""
        if self.collector is None:
            raise RuntimeError("this Trainer is closed; resume its run with a new Trainer")
        self._notes()
        s = self._open_session()
        with SignalStop(self._on_signal):  # Ctrl-C and SIGTERM stop with a checkpoint
            try:
                while self.counters["env_steps"] < self.cfg.run.steps and not self._stopping():
                    finished = self._collect_once()  # act in the envs; steps to the replay
                    self._episodes_ended(s, finished, callback)
                    self._train_due(s)  # the updates the train ratio asks for by now
                    self._on_schedule(s)  # log, evaluate, videos, checkpoint, when due
                self._close_session(s, end_videos)
            except (EnvError, NonFiniteError):
                raise  # saved already
            except OSError as exc:
                if not ckpt.disk_full(exc):
                    self._save_after(exc)
                    raise
                raise disk_full_error(exc, self.run_dir, self.counters["env_steps"],
                                      self.resume_hint()) from None  # no checkpoint would fit
            except BaseException as exc:  # a second Ctrl-C, a raising callback, a bug
                self._save_after(exc)
                raise
            finally:
                self._batches.close()
                s.logger.close()
        return self.run_dir

    # The steps of run(), in its order.

    def _notes(self) -> None:
        """What the user should know before a run starts (rank 0 says it)."""
        if self.ranks.is_main:
            notes.before_run(self.cfg, self.counters, self.act_spec,
                             self.device, self.ratio, self.ranks.world)

    def _open_session(self) -> _Session:
        """The logger, the clocks and the batch source of one run() call."""
        cfg, c = self.cfg, self.counters
        self.stop_requested, self.signalled, self.stop_reason = False, None, None
        logger = Logger(self.run_dir, progress=cfg.run.progress, total_steps=cfg.run.steps,
                        start_steps=c["env_steps"], config=cfg,
                        purge_after=self._purge_logs_after, fields={"seed": cfg.run.seed}) \
            if self.ranks.is_main else _QuietLogger()
        if self._purge_logs_after is not None:
            from .video import set_aside_videos_after
            if moved := set_aside_videos_after(self.run_dir, self._purge_logs_after):
                note(f"{len(moved)} videos of steps past the checkpoint moved to "
                     f"{moved[0].parent}")
        self._purge_logs_after = None
        # Batches for the updates: sampled on a background thread where the device chose it.
        # A window of replay context starts with the step before it (its stored latents).
        self._batches = Prefetcher(self.replay, cfg.train.batch_size, cfg.train.window,
                                   self.device, background=self.cfg.train.prefetch,
                                   locate=bool(cfg.train.replay_context))
        now = self._session_start = time.time()  # run.time_limit counts from here
        return _Session(logger=logger, start=now - c["wall_time"],
                        rows=MetricRows(c, now), last_ckpt=now, last_ckpt_steps=c["env_steps"],
                        evals=Every(cfg.run.eval_every, c["env_steps"]),
                        videos=Every(cfg.run.video_every, c["env_steps"]),
                        endless_noted=c["episodes"] > 0, first_ckpt=c["updates"] == 0)

    def _collect_once(self) -> list:
        """One collection step (random actions during prefill); a bad env step stops the run
        with a checkpoint (the step never reached the replay). Returns finished episodes."""
        c = self.counters
        t = self.cfg.train
        random = t.prefill_random and c["env_steps"] < t.prefill
        policy = None if random else self.agent.acting(c["env_steps"])  # or an explorer
        try:
            n, finished = self._collect(policy)
        except (ValueError, KeyError, EnvError) as exc:  # NaN, wrong shape, crashing
            self.save()
            raise EnvError(
                f"{exc} (at {c['env_steps']} env steps); stopped with a checkpoint in "
                f"{self.run_dir}: fix the environment, then continue with "
                f"{self.resume_hint()}") from exc
        c["env_steps"] += n
        return finished

    def _collect(self, policy) -> tuple[int, list]:
        """New experience into the replay: local vector-env step or the next Ray runner
        chunk. Returns the env steps added (summed over data-parallel ranks: every rank
        counts the same steps, so makes the same updates) and this process's episodes."""
        n, finished = self.collector.collect(policy, self.replay)
        return int(self.ranks.sum(n)), finished

    def _episodes_ended(self, s: _Session, finished: list, callback) -> None:
        """Log the finished episodes and ask the callback whether to go on."""
        c = self.counters
        if not s.endless_noted and c["env_steps"] >= notes.NO_EPISODE_STEPS:
            s.endless_noted = True
            if not (c["episodes"] or finished) and self.ranks.is_main:
                notes.no_episode(c["env_steps"])
        for ep in finished:
            c["episodes"] += 1
            self.achievements.update(ep.info)  # the suite's own episode metrics
            # An episode that the env's crash cut short (env.max_restarts) is logged marked
            # `cut` and left out of the returns that judge the agent (the recent mean,
            # run.target_return, curves and reports): its return is only a part.
            cut = bool(ep.info.get("env_restarted"))
            if not cut:
                self.recent = (self.recent + [ep.ret])[-10:]
            s.logger.episode({"env_steps": c["env_steps"], "return": ep.ret,
                              "length": ep.length, "wall_time": time.time() - s.start,
                              "eval": False, **({"cut": True} if cut else {})})
            if callback is not None:  # None goes on, any other falsy value stops
                go_on = callback({**c, "return": ep.ret, "length": ep.length, "info": ep.info})
                if go_on is not None and not go_on:
                    self.stop_requested, self.stop_reason = True, "the callback returned False"

    def _train_due(self, s: _Session) -> None:
        """Update until the updates reach what the train ratio allows for the env steps so
        far. Metrics stay on the device (summed until the next log row); the count of
        non-finite steps is the one value read back per update."""
        c, check_every = self.counters, self.cfg.run.dist_check_every
        while c["updates"] < self.updates_due() and self._can_sample():
            batch = self._batches.get()  # perf/batch_wait_ms
            metrics = self.agent.train_step(batch)
            self._write_latents(batch)
            self._count_nonfinite(s, metrics["train/nonfinite_steps"] > 0)
            s.rows.add(metrics)
            c["updates"] += 1
            if check_every and c["updates"] % check_every == 0:
                self.ranks.check_identical(self.agent)

    def _write_latents(self, batch: dict) -> None:
        """train.replay_context: the latents the last update inferred for the steps of
        `batch` (where they live: `_env`, `_step`) replace the stored ones."""
        context = self.cfg.train.replay_context
        if context:
            self.replay.write(batch["_env"], batch["_step"][:, context:],
                              self.agent.replay_writes())

    def _count_nonfinite(self, s: _Session, bad: bool) -> None:
        """Skipped updates (non-finite losses or gradients); too many in a row stop the run."""
        c = self.counters
        s.bad_in_row = s.bad_in_row + 1 if bad else 0
        c["nonfinite_updates"] += int(bad)
        if s.bad_in_row >= self.cfg.train.max_nonfinite:
            self.save()  # skipped steps changed nothing: the last good state
            raise NonFiniteError(
                f"{s.bad_in_row} updates in a row had non-finite losses or gradients (at "
                f"{c['env_steps']} env steps); stopped with a checkpoint of the last good "
                f"state in {self.run_dir}. Check the environment's observations and rewards, "
                f"or lower the learning rates")

    def _can_sample(self) -> bool:
        """Whether the replay holds a window, on every data-parallel rank (an update is
        collective: with Ray runners ranks fill at their own pace); once true, true."""
        if not self._sampling:
            t = self.cfg.train
            ok = self.replay.can_sample(t.window)
            self._sampling = not self.ranks.any(not ok)
        return self._sampling

    def _on_schedule(self, s: _Session) -> None:
        """What falls due by now: a metric row, an evaluation, videos, a checkpoint."""
        cfg, c, main = self.cfg, self.counters, self.ranks.is_main
        now = time.time()
        c["wall_time"] = now - s.start
        c["env_restarts"] = self.collector.restarts + self._restarts_before  # for the row
        if now - s.rows.last >= cfg.run.log_every:
            self._log_row(s, now)
        if main and s.evals(c["env_steps"]):
            self._evaluate(s.logger, s.start)
        if main and s.videos(c["env_steps"]):
            self._videos(s.logger)
        every = cfg.run.checkpoint_every
        # The first checkpoint comes with the first updates, not after checkpoint_minutes:
        # a run killed early (SIGKILL, out of memory) can then be resumed.
        first = s.first_ckpt and c["updates"] > 0
        if (first or now - s.last_ckpt >= cfg.run.checkpoint_minutes * 60
                or (every and c["env_steps"] - s.last_ckpt_steps >= every)):
            self.save()
            s.last_ckpt, s.last_ckpt_steps, s.first_ckpt = now, c["env_steps"], False

    def _log_row(self, s: _Session, now: float) -> None:
        c = self.counters
        run = {"replay/steps": len(self.replay), "train/nonfinite_updates": c["nonfinite_updates"],
               "train/env_restarts": c["env_restarts"]}
        wait = self._batches.wait_ms()
        if wait is not None:  # mean time an update waited for its batch (sampling included
            run["perf/batch_wait_ms"] = wait  # without train.prefetch)
        run.update(self.collector.metrics())  # Ray runners: policy lag, restarts
        run.update(self.ranks.metrics())  # data-parallel learners
        tail = self.achievements.metrics()
        if self.recent:
            tail["episode/return_recent"] = float(np.mean(self.recent))
        s.logger.metrics(s.rows.take(c, now, run, tail))

    def evaluate(self, episodes: int, explore: bool = False, seed: int | None = None):
        """Full episodes in a fresh env of this run with the greedy (or sampled) policy."""
        return evaluate_agent(self.agent, self.cfg, self.obs_spec, self.act_spec, episodes,
                              explore, seed)

    def _evaluate(self, logger: Logger, start: float) -> None:
        """The periodic evaluation; an env that fails there costs the evaluation, not the run."""
        steps = self.counters["env_steps"]
        for explore in (False, True):
            try:
                eps = self.evaluate(self.cfg.run.eval_episodes, explore,
                                    seed=eval_seed(self.cfg.run.seed, steps))
            except Exception as exc:  # noqa: BLE001 - any error of the env's (not Ctrl-C)
                warn(f"evaluation at {steps} env steps failed ({type(exc).__name__}: {exc}); "
                     f"training goes on")
                return
            for ep in eps:
                logger.episode({"env_steps": steps, "return": ep.ret, "length": ep.length,
                                "wall_time": time.time() - start, "eval": True,
                                "policy": "sampled" if explore else "greedy"})

    def _videos(self, logger: Logger) -> None:
        from .video import log_videos
        self.videos_logged_at = steps = self.counters["env_steps"]  # finish_run: not again
        try:
            logger.videos(log_videos(self, logger.tb, steps), steps)
        except Exception as exc:  # noqa: BLE001 - a video never costs the run
            warn(f"video logging failed: {type(exc).__name__}: {exc}")

    def _stopping(self) -> bool:
        """Stop on a signal, the callback, the time limit or the target return; data-parallel
        ranks stop together when any of them would."""
        reason = None if self.stop_requested else \
            early_stop(self.cfg.run, self._session_start, self.recent)
        self.stop_reason = reason or self.stop_reason
        stop = self.stop_requested or reason is not None
        if self.ranks.any(stop) and not stop:
            self.stop_reason = self.stop_reason or "another data-parallel rank stopped " \
                "(its run.target_return, time limit or signal)"
            return True
        return stop

    def _on_signal(self, signum: int) -> None:
        self.stop_requested = True
        self.stop_reason = signal.Signals(signum).name
        self.signalled = signum  # for the caller: `lucid train` reports it and exits 128 + N

    def _close_session(self, s: _Session, end_videos: bool) -> None:
        """The last metric row, a checkpoint, and the end-of-run videos."""
        c = self.counters
        now = time.time()
        c["wall_time"] = now - s.start
        if s.rows.n:
            self._log_row(s, now)
        self.ranks.check_identical(self.agent)
        self.save()
        if end_videos and not self.stop_requested and self.ranks.is_main \
                and self.videos_logged_at != c["env_steps"]:
            print("writing the end-of-run videos ...", flush=True)
            self._videos(s.logger)  # while the run's loggers are open (one W&B session)

    def _save_after(self, exc: BaseException) -> None:
        try:
            path = self.save()
        except Exception as again:  # noqa: BLE001 - e.g. the disk is full: the older ones stay
            warn(f"could not save a checkpoint after {type(exc).__name__} "
                 f"({type(again).__name__}: {again}); the previous checkpoints are intact")
            return
        if path is not None:
            print(f"stopped by {type(exc).__name__}: saved {path}; continue with "
                  f"{self.resume_hint()}")


def train(cfg: Config, run_dir: str | Path | None = None, resume: bool = False) -> Path:
    trainer = Trainer(cfg, run_dir, resume)
    try:
        return trainer.run()
    finally:
        trainer.close()
