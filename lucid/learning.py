"""A learning run's state, as the loop (train.py) finds it: its directory (claimed and
locked, or resumed), config, device, agent, replay, collector and counters; written to a
checkpoint and closed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from . import checkpoint as ckpt
from . import distributed, notes
from .agents import agent_class
from .config import Config, to_yaml
from .device import chosen_for, learn_as_chosen
from .envs import env_label, episode_metrics
from .envs.checks import close_env, spaces_of
from .parts import make_collector, make_replay, new_counters, resolve_ids, set_up_process
from .resume import restore, resume_hint, resumed_config
from .rundir import RunDirClaim
from .schedule import Ratio
from .seeds import seed_everything


class LearningRun:
    """Owns the agent, replay, collector and counters of one run directory."""

    _batches = None  # the learner's batch source while it trains (Trainer.run)

    def __init__(self, cfg: Config, run_dir: Path | str | None = None, resume: bool = False,
                 env: str | None = None, settings: tuple[str, ...] = (), agent=None):
        """A new run in `run_dir` (or cfg.run.run_dir, else a fresh directory under runs/),
        or with `resume` the run saved there, continued with `cfg`'s run.steps (when not 0)
        and run.device, and `cfg`'s values of the `settings` keys (of RESUME_SETTABLE). `env`
        (with `resume`) replaces the saved env id: a run on an env instance continues with
        the instance given again. `agent` (a new run): the Agent of `cfg` to train, as it is
        (Dreamer's agent before its first learn()), instead of a new one."""
        # Data-parallel learners (torchrun): rank 0's run directory is everyone's.
        self.ranks = distributed.ranks(cfg.run.device)
        self.closed = False  # by close(): the envs and the lock are gone
        self._purge_logs_after: int | None = None  # a resumed run's logs past its checkpoint
        self._claim = RunDirClaim(self.ranks)
        given = run_dir or cfg.run.run_dir
        if given:  # run.run_dir=~/runs/x, --run-dir=~/x: no shell expanded the ~ (else a
            given = Path(given).expanduser()  # directory named ~ in the working directory)
        try:
            self._build(cfg, given, resume, env, settings, agent)
        except BaseException:
            self._claim.discard_failed_start()  # while the lock still keeps others out
            self._claim.release()
            raise

    def _build(self, cfg: Config, given, resume: bool, env, settings, agent) -> None:
        if resume:
            cfg, loaded = self._resumed(cfg, given, env, settings)
        resolve_ids(cfg)
        rank = self.ranks.rank
        self.device = self.ranks.device_for(cfg.run.device)
        # The run's one config, with the settings it leaves to the device chosen here (the
        # agent's); config.yaml and checkpoints keep those null (`saved_config`), so that a
        # resume on another device chooses them there.
        self.cfg = chosen_for(cfg, self.device, data_parallel=self.ranks.parallel)
        self._left_to_device = [f.name for f in dataclasses.fields(cfg.train)
                                if getattr(cfg.train, f.name) is None
                                and getattr(self.cfg.train, f.name) is not None]
        self.obs_spec, self.act_spec = spaces_of(cfg)  # a bad env fails before any file is written
        agent_cls = agent_class(cfg)  # so does a bad model.agent
        if not resume:
            self.run_dir = self._claim.new(given, cfg)
            if self.ranks.is_main:  # a resume's, once its checkpoint loaded
                self.write_config()
        set_up_process(cfg, rank)
        self.agent = self._make_agent(agent_cls, agent, cfg)
        # A new run's ranks > 0 make their replay (memory-mapped: files in the run directory)
        # once every rank has started, so that rank 0, which takes the directory away when
        # its start fails, cannot race one of them writing into it.
        late = not self.ranks.is_main and not resume
        self.replay = make_replay(cfg, self.obs_spec, self.act_spec, self.run_dir, rank,
                                  build=not late)  # a replay that cannot work: refused
        self.counters = new_counters()
        self.achievements = episode_metrics(cfg.env.id)  # e.g. Crafter's score and rates
        self.recent: list[float] = []  # the last 10 episodes' returns (run.target_return)
        t = cfg.train  # env_steps counts all ranks' steps; each update replays B·T on each
        self.ratio = Ratio(t.train_ratio, t.prefill,
                           t.batch_size * t.batch_length * self.ranks.world)
        if resume:
            self._restore(*loaded)
        self.ranks.attach(self.agent)  # rank 0's parameters; gradients averaged over ranks
        self.collector = make_collector(cfg, self.obs_spec, self.act_spec, self.counters, rank)
        self._start_together(late)
        # A resume's run.steps and settings, once it has started (a failed one writes
        # nothing) and where it goes on (a --steps below the steps done trains nothing)
        if resume and self.ranks.is_main and cfg.run.steps > self.counters["env_steps"]:
            self.write_config()
        self._restarts_before = self.counters["env_restarts"]

    def _resumed(self, cfg: Config, given, env, settings):
        self.run_dir = Path(self.ranks.broadcast_object(str(Path(given))))
        # Held before anything there is read, renamed or written; a directory that is no
        # run is refused next, without a lock file left in it.
        if any((self.run_dir / n).exists() for n in ("config.yaml", "checkpoints")):
            self._claim.hold(self.run_dir)
        # Rank 0 alone renames a corrupt checkpoint (two ranks raced to); the others skip
        # it as unreadable, or as gone once renamed, to the same previous one.
        return resumed_config(cfg, self.run_dir, self.ranks.is_main, env, settings)

    def _make_agent(self, agent_cls, agent, given: Config):
        made = agent_cls(self.obs_spec, self.act_spec, self.cfg, self.device)
        if agent is not None:  # made as this one was (the same draws: runs repeat by seed)
            made = agent
            learn_as_chosen(agent, given, self.cfg)
        made.check_optimizers()  # a network assigned after the optimizers would never train
        return made

    def _restore(self, payload: dict, path: Path) -> None:
        print(restore(self, payload, path, self.ranks.rank, learn=True, reseed=seed_everything))
        c = self.counters
        was = self.ratio.resume(payload.get("schedule"), c["updates"], c["env_steps"])
        if self.ranks.is_main:
            if was is not None:
                notes.schedule_changed(was, self.ratio.state_dict(), c["updates"])
            self._purge_logs_after = c["env_steps"]  # rows logged after the checkpoint

    def _start_together(self, late: bool) -> None:
        """Every rank started (a rank that failed never gets here); the ranks that made a
        late replay stop together when one could not (no disk space, no memory), so that
        none trains on alone and rank 0 takes the directory away."""
        self.ranks.barrier()
        failed = None
        if late:
            try:
                self.replay = make_replay(self.cfg, self.obs_spec, self.act_spec,
                                          self.run_dir, self.ranks.rank)
            except Exception as exc:  # noqa: BLE001 - every rank hears of it, below
                failed = exc
        if self.ranks.any(failed is not None):
            raise failed or RuntimeError(
                "another data-parallel rank could not make its replay; its error is in "
                "that rank's output")

    # ------------------------------------------------------------------ persistence

    def save(self) -> Path | None:
        """Append the new replay steps to disk, then write a complete checkpoint atomically.
        A kill at any moment leaves the previous checkpoint and all earlier chunks intact."""
        self.replay.flush()
        if not self.ranks.is_main:  # only rank 0 checkpoints (ranks > 0 keep replays)
            return None
        payload = {
            "agent": self.agent.state_dict(),
            "counters": dict(self.counters),
            "rng": ckpt.rng_state(),
            "replay_rng": self._replay_rng_state(),
            "replay_count": self.replay.count,
            "schedule": self.ratio.state_dict(),
            "recent_returns": list(self.recent),
            "achievements": self.achievements.state_dict(),
            "config": to_yaml(self.saved_config()),
        }
        return ckpt.save_checkpoint(self.run_dir, payload, keep=self.cfg.run.keep_checkpoints)

    def _replay_rng_state(self) -> dict:
        if self._batches is not None:  # not the state after the prefetched batch
            return self._batches.rng_state()
        with self.replay.lock:
            return self.replay.rng_state()

    def write_config(self) -> None:
        """RUN_DIR/config.yaml: the run's config, run.steps saying how far it goes."""
        ckpt.atomic_write_text(self.run_dir / "config.yaml", to_yaml(self.saved_config()))

    def saved_config(self) -> Config:
        """`cfg` as config.yaml and checkpoints keep it: the settings that the device chose
        null again."""
        if not self._left_to_device:
            return self.cfg
        train = dataclasses.replace(self.cfg.train, **dict.fromkeys(self._left_to_device))
        return dataclasses.replace(self.cfg, train=train)

    def resume_hint(self) -> str:
        return resume_hint(self.cfg.env.id, self.run_dir)

    def close(self) -> None:
        """Close the env runners, leave the process group, release the directory's lock."""
        collector, self.collector = self.collector, None
        try:
            if collector is not None:
                close_env(collector, env_label(self.cfg.env.id))
            self.ranks.close()
        finally:  # the directory is released whatever else failed
            self._claim.release()
            self.closed = True

    def __enter__(self) -> "LearningRun":  # `with Trainer(cfg) as tr: tr.run()` closes it
        return self

    def __exit__(self, *exc) -> None:
        self.close()
