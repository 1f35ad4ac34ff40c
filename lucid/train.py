"""The training loop (the paper's algorithm box):

    prefill the replay with random actions
    repeat until `run.steps` environment steps:
        step the vector env with the policy, store the step in the replay
        while updates < (env steps since prefill) · train_ratio / (B·T):
            sample B windows of length T, update world model, actor, critic
        log, evaluate and checkpoint on their schedules
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml

from . import checkpoint as ckpt
from .agent import agent_class
from .config import (RESUME_SETTABLE, Config, ConfigError, as_dict, flatten, from_yaml,
                     for_device, make_config, to_yaml)
from .envs import env_fn, env_label, episode_metrics, instances
from .logger import Logger
from .plugins import is_file_id, resolve_id
from .replay import Prefetcher, Replay
from .envs.checks import close_env, spaces_of
from .runner import Collector, EnvError, evaluate, restarting
from .system import tune_malloc
from . import distributed
from .warn import warn


class _QuietLogger:
    """Data-parallel ranks > 0 log nothing: every Logger method is a no-op here."""
    tb = None

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class NonFiniteError(RuntimeError):
    """Training produced non-finite losses or gradients too many times in a row."""


class DiskFullError(OSError):
    """The disk under the run directory is full: the run stopped at its last checkpoint."""


def resolve_device(name: str) -> torch.device:
    """`run.device`: auto (CUDA if torch sees a GPU, else CPU), cpu, cuda or cuda:N. A device
    that torch cannot name or this machine lacks is a ValueError (a one-line CLI error)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"run.device={name} is not a device torch knows; "
                         "use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"run.device={name} but torch sees no CUDA device; "
                             "use --device cpu (or auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"run.device={name} but torch sees {torch.cuda.device_count()} "
                             f"CUDA device(s): cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return device


# What a checkpoint fixes: the agent's shapes (model), and the replay's env streams (env,
# runners). A hand edit of these in config.yaml cannot be resumed. env.kwargs may change (a
# bad kwarg fixed): spaces that no longer fit are refused when the checkpoint is loaded.
_FIXED_ON_RESUME = ("model", "env.id", "env.num_envs", "run.runners", "run.num_runners",
                    "run.envs_per_runner")


# The settings of the fastest update measured on a GPU (for_device's CUDA choices).
_GPU_FAST = ("compile", "precision", "cuda_graph", "onehot_gather", "prefetch")


def gpu_speed_note(cfg: Config, device: torch.device, data_parallel: bool = False) -> str | None:
    """On a CUDA device, the settings of the fastest update measured on a GPU that `cfg` (as
    the agent has it: nulls chosen) was set away from: CUDA's defaults for one process, as
    `for_device` chooses them on this GPU. Data-parallel learners run eager (no graph there;
    the rest unmeasured), so nothing is said to them."""
    if device.type != "cuda" or data_parallel:
        return None
    t = cfg.train
    best = for_device(dataclasses.replace(
        cfg, train=dataclasses.replace(t, **dict.fromkeys(_GPU_FAST))), "cuda").train
    missing = [f"train.{k}={str(getattr(best, k)).lower()}" for k in _GPU_FAST
               if getattr(t, k) != getattr(best, k)]
    if not missing:
        return None
    return (f"on this GPU, {' '.join(missing)} (the default on CUDA) would make training "
            f"faster: on an H200 the update compiled, graphed and in bf16 with dense one-hots "
            f"took 10.6 ms at size S and 37.4 ms at XL, against 28.4 ms graphed in bf16 and "
            f"90.6 ms eager in fp32 at S (docs/performance.md: GPU results)")


def compile_note(cfg: Config, device: torch.device) -> str | None:
    """`train.compile` (CUDA's default): the first update waits for the compiler."""
    if not cfg.train.compile:
        return None
    took = ("1-2 minutes on an H200" if device.type == "cuda"
            else "2.5-5 minutes on a 2-core CPU")
    return (f"train.compile=true: the update is compiled before the first one (about {took}; "
            f"once per run and batch shape); train.compile=false starts at once, with slower "
            f"updates")


def check_resumable(saved: Config, cfg: Config, where: Path) -> None:
    """Refuse a resume whose config.yaml changed what the checkpoint and replay were built
    for, naming every changed key, before anything is loaded."""
    old, new = flatten(as_dict(saved)), flatten(as_dict(cfg))
    if instances.is_instance(old["env.id"]):
        # An instance's name does not outlive its process: such a run goes on in the env
        # given again (an instance, or a name that makes the same env), whose spaces must
        # fit the checkpoint when it is loaded.
        del old["env.id"], new["env.id"]
    for key in ("env.id", "model.agent"):  # file.py:Attr moved with its project
        if key in old and all(is_file_id(c.get(key, "")) for c in (old, new)) \
                and env_label(old[key]) == env_label(new[key]):
            del old[key], new[key]
    changed = [f"{k}: {old.get(k)!r} in the checkpoint, {new.get(k)!r} in config.yaml"
               for k in sorted(set(old) | set(new))
               if k.startswith(_FIXED_ON_RESUME) and old.get(k) != new.get(k)]
    if cfg.run.runners != "ray":  # runner counts of a local run do not shape anything
        changed = [c for c in changed if not c.startswith(("run.num_runners", "run.envs_per"))]
    if changed:
        raise ConfigError(f"{where} changed what this run's checkpoint and replay were made "
                          f"for: {'; '.join(changed)}. Put those values back to resume or load "
                          f"it, or start a new run with the new settings")


def resumed_env(saved: str, given: str) -> str:
    """The env id a resume continues in when given `given` (Dreamer.load(..., resume=True,
    env=...)): a run on an env instance goes on in the env given, whose spaces must fit its
    checkpoint; a run on a named env only in that env, which it makes again by name (the
    rule config.yaml edits meet: another env's id would be refused by the next resume)."""
    if instances.is_instance(saved) or given == saved or (
            is_file_id(saved) and is_file_id(given) and env_label(saved) == env_label(given)):
        return given
    what = (f"an env instance ({env_label(given)})" if instances.is_instance(given)
            else repr(given))
    raise ConfigError(f"this run was trained on {saved!r}, which a resume makes again by name; "
                      f"leave out env= to continue it (given {what}). To go on learning with "
                      f"its weights in another env, load it without resume: Dreamer.load(path, "
                      f"env=...) learns into a new run directory")


def resume_hint(env_id: str, run_dir) -> str:
    """How to continue a run: the CLI, or for a run on an env instance (which no other
    process can rebuild) Dreamer.load with the instance again."""
    if instances.is_instance(env_id):
        return f"Dreamer.load({str(run_dir)!r}, resume=True, env={env_label(env_id)}(...))"
    return f"`lucid train --resume {run_dir}`"


def resumed_device(saved: str, given: str) -> str:
    """`run.device` of a resumed run (or one loaded for eval): the device asked for now when one
    is (not auto); else the run's own where this machine has it; else auto's choice here, with
    a note (a run trained on a GPU evaluates on a laptop)."""
    if given != "auto":
        return given
    try:
        resolve_device(saved)
        return saved
    except ValueError:
        print(f"note: the run was trained with run.device={saved}, which this machine lacks; "
              f"continuing on {resolve_device('auto')} (run.device=auto)")
        return "auto"


def load_here(cfg: Config, device: str) -> None:
    """A saved run's config for this machine: `run.device` as `resumed_device` picks it, and
    the GPU-only `train.cuda_graph` off where that is no CUDA device (the same maths)."""
    cfg.run.device = resumed_device(cfg.run.device, device)
    if cfg.train.cuda_graph and resolve_device(cfg.run.device).type != "cuda":
        print("note: the run was trained with train.cuda_graph=true, which needs a CUDA "
              "device; continuing with train.cuda_graph=false (the same update, not captured)")
        cfg.train.cuda_graph = False


def slow_preset_note(trainer: "Trainer", spell: str) -> str | None:
    """For a preset picked by the env's domain, not by the user: a note when it is one of the
    paper's settings and the run is on a CPU, naming the CPU presets as `spell` writes a preset
    name (`--preset {}` for the CLI, `preset='{}'` for Python)."""
    cfg = trainer.cfg
    if trainer.device.type != "cpu" or cfg.preset.startswith("cpu-") \
            or cfg.train.train_ratio != make_config(cfg.preset).train.train_ratio:
        return None  # (a train ratio of the user's: the choice is made)
    return (f"preset {cfg.preset} is the paper's setting (train ratio "
            f"{cfg.train.train_ratio:g}), slow on a CPU; for a small task try "
            f"{spell.format('cpu-control')} (vector observations) or "
            f"{spell.format('cpu-pixels')} (images)")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def default_run_dir(cfg: Config) -> Path:
    name = env_label(cfg.env.id).replace(":", "-").replace("/", "-")
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-s{cfg.run.seed}"


NO_EPISODE_NOTE = 10_000  # env steps without a finished episode before a run says so
VIEW_STEPS = 2**15  # replay steps a run loaded with learn=False (eval, dream) holds


RUN_FILES = ("checkpoints", "replay", "metrics.jsonl", "episodes.jsonl")  # a run's data


def _has_data(path: Path) -> bool:
    """A non-empty file or a directory with something in it."""
    return path.stat().st_size > 0 if path.is_file() else path.is_dir() and any(path.iterdir())


def _lucid_config(path: Path) -> bool:
    """Whether `path` may be a lucid run's config.yaml (empty, or a mapping of its sections,
    e.g. one that a failed start left), not some other program's file of that name."""
    try:
        tree = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    sections = {f.name for f in dataclasses.fields(Config)}
    return tree is None or isinstance(tree, dict) and set(map(str, tree)) <= sections


def claim_run_dir(given: Path | None, cfg: Config) -> Path:
    """The directory of a new run: `given` if it holds no run's data yet (never another run's
    files overwritten; a config.yaml alone, left by a start that failed, is replaced), else a
    fresh runs/ENV-TIME-sSEED, with -2, -3, ... when two runs start in the same second."""
    if given is not None:
        if given.exists() and not given.is_dir():
            raise ConfigError(f"the run directory {given} is a file; give a directory")
        held = [n for n in RUN_FILES if _has_data(given / n)]
        if held and not ckpt.list_checkpoints(given):  # --resume would find nothing to load
            raise ConfigError(
                f"{given} holds the files ({', '.join(held)}) of a run that stopped before its "
                f"first checkpoint, so it cannot be resumed; give another run directory, or "
                f"delete {given} to use its name again. Nothing was written")
        if held:
            try:  # a run on an env instance continues from Python only
                held_env = str(yaml.safe_load((given / "config.yaml").read_text())["env"]["id"])
            except Exception:
                held_env = ""
            how = resume_hint(held_env, given)
            if not instances.is_instance(held_env):
                how += " (or Dreamer.load)"
            raise ConfigError(
                f"{given} already holds a run ({', '.join(held)}); continue it with {how}, or "
                f"give another run directory. Nothing was written")
        if (given / "config.yaml").is_file() and not _lucid_config(given / "config.yaml"):
            raise ConfigError(
                f"{given} has a config.yaml that is not a lucid run's, which a new run there "
                f"would overwrite; give another run directory (e.g. {given / 'run'}). Nothing "
                f"was written")
        try:
            given.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError, PermissionError) as exc:
            raise ConfigError(f"cannot make the run directory {given}: {exc.strerror} "
                              f"({exc.filename}); give another --run-dir") from None
        return given
    base = default_run_dir(cfg)
    base.parent.mkdir(parents=True, exist_ok=True)
    for i in itertools.count(1):
        path = base if i == 1 else base.with_name(f"{base.name}-{i}")
        try:
            path.mkdir()  # atomic: two processes never get the same directory
            return path
        except FileExistsError:
            continue


@dataclass
class _Session:
    """The loop state of one `Trainer.run` call: its logger, clocks, schedules and the
    metrics summed since the last row."""
    logger: Logger | _QuietLogger
    start: float  # wall-clock origin: wall_time goes on across resumes
    last_log: float
    last_ckpt: float
    last_ckpt_steps: int
    log_steps: int  # env steps and updates at the last metric row
    log_updates: int
    next_eval: int | None  # env steps of the next evaluation and videos (None: never)
    next_video: int | None
    endless_noted: bool  # said (or no need to say) that no episode has ended
    bad_in_row: int = 0  # updates in a row with non-finite losses or gradients
    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    n_sums: int = 0


class Trainer:
    """Owns the agent, replay, collector and counters of one run directory."""

    def __init__(self, cfg: Config, run_dir: Path | str | None = None, resume: bool = False,
                 learn: bool = True, env: str | None = None, settings: tuple[str, ...] = (),
                 agent=None):
        """A new run in `run_dir` (or cfg.run.run_dir, else a fresh directory under runs/),
        or with `resume` the run saved there, continued with `cfg`'s run.steps (when not 0)
        and run.device, and `cfg`'s values of the `settings` keys (of RESUME_SETTABLE).
        `learn=False` loads a run to evaluate or dream with: its config.yaml stays as it is
        and no env runners start (without `resume`, there is no run directory: an agent to
        act and evaluate with). `env` (with `resume`) replaces the
        saved env id: a run on an env instance (Dreamer(MyEnv())) continues with the
        instance given again. `agent` (a new run): the Agent of `cfg` to train, as it is
        (Dreamer's agent before its first learn()), instead of a new one."""
        # Data-parallel learners (torchrun): rank 0's run directory is everyone's.
        self.dist = distributed.DataParallel(cfg.run.device) if distributed.launched() else None
        self.rank = self.dist.rank if self.dist else 0
        self._learn = learn
        self.closed = False  # by close(): a learning run's envs and lock are gone
        self._purge_logs_after: int | None = None  # a resumed run's logs past its checkpoint
        self._lock: ckpt.RunLock | None = None  # a learning rank 0's, from _hold() to close()
        self._made_dir: Path | None = None  # the new run's directory, where this start made it
        given = run_dir or cfg.run.run_dir
        if given:  # run.run_dir=~/runs/x, --run-dir=~/x: no shell expanded the ~ (else a
            given = Path(given).expanduser()  # directory named ~ in the working directory)
        try:
            self._build(cfg, given, resume, learn, env, settings, agent)
        except BaseException:
            self._discard_failed_start()  # while the lock still keeps other processes out
            self._release()
            raise

    def _build(self, cfg: Config, given, resume: bool, learn: bool, env: str | None,
               settings: tuple[str, ...], agent) -> None:
        if resume:
            self.run_dir = Path(given)
            if self.dist is not None:
                self.run_dir = Path(self.dist.broadcast_object(str(self.run_dir)))
            # Held before anything there is read, renamed or written; a directory that is no
            # run is refused just below, without a lock file left in it.
            if any((self.run_dir / n).exists() for n in ("config.yaml", "checkpoints")):
                self._hold()
            saved, loaded = self._saved_config()
            # The checkpoint is read now, so that a config.yaml it does not fit is refused
            # before anything is written (it is the config-recovery path's, when that ran).
            # Rank 0 alone renames a corrupt checkpoint (two ranks raced to); the others
            # skip it as unreadable, or as gone once renamed, to the same previous one.
            loaded = loaded or ckpt.load_latest(self.run_dir, set_aside=learn and self.rank == 0)
            payload, found = loaded
            check_resumable(from_yaml(payload["config"], where=f"the config stored in {found}"),
                            saved, self.run_dir / "config.yaml")
            if env is not None:
                saved.env.id = resumed_env(saved.env.id, env)
            saved.run.steps = cfg.run.steps or saved.run.steps
            for key in settings:
                if key not in RESUME_SETTABLE:
                    raise ConfigError(f"{key} cannot be changed on resume (these can: "
                                      f"{', '.join(RESUME_SETTABLE)})")
                section, name = key.split(".", 1)
                setattr(getattr(saved, section), name, getattr(getattr(cfg, section), name))
            load_here(saved, cfg.run.device)
            cfg = saved
        cfg.env.id = resolve_id(cfg.env.id)  # path/to/file.py:Env from any directory
        cfg.model.agent = resolve_id(cfg.model.agent)  # path/to/file.py:Class too
        self.cfg = cfg
        self.device = self.dist.device if self.dist else resolve_device(cfg.run.device)
        self.obs_spec, self.act_spec = spaces_of(cfg)  # a bad env fails before any file is written
        agent_cls = agent_class(cfg)  # so does a bad model.agent
        if not resume and not learn:  # an agent to act with: no run directory at all
            self.run_dir = None
        elif not resume:
            self.run_dir = self._new_run_dir(Path(given) if given else None)
            self._hold()
        if self.rank == 0 and learn and not resume:  # a resume's, once its checkpoint loaded
            self.write_config()
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        if cfg.run.tune_malloc:
            tune_malloc()
        seed_everything(cfg.run.seed + 7919 * self.rank)
        # null settings chosen for the learner's device; self.cfg (config.yaml) keeps them.
        # An agent that only acts (evaluation, dreams) is not compiled unless asked: its
        # first steps would wait for the compiler.
        chosen = for_device(cfg if learn or cfg.train.compile is not None else
                            dataclasses.replace(cfg, train=dataclasses.replace(
                                cfg.train, compile=False)),
                            self.device.type, data_parallel=bool(self.dist))
        self.agent = agent_cls(self.obs_spec, self.act_spec, chosen, self.device)
        if agent is not None:  # made as this one was (the same draws: runs repeat by seed)
            self.agent = agent
            t = agent.config.train
            if learn and cfg.train.compile is None and chosen.train.compile and not t.compile:
                # Made to act (Dreamer before its first learn()), so not compiled: it learns
                # as the device chose, compiled and in the precision that goes with it.
                agent.config = dataclasses.replace(agent.config, train=dataclasses.replace(
                    t, compile=True, precision=chosen.train.precision))
                agent._compile()
        if learn:  # a network assigned after the optimisers were made would never train
            self.agent.check_optimisers()
        # A new run's ranks > 0 make their replay (memory-mapped: files in the run directory)
        # once every rank has started, so that rank 0, which takes the directory away when
        # its start fails, cannot race one of them writing into it.
        late = self.dist is not None and self.rank > 0 and not resume
        self.replay = self._make_replay(build=not late)  # a replay that cannot work: refused
        self.counters = {"env_steps": 0, "updates": 0, "episodes": 0, "wall_time": 0.0,
                         "nonfinite_updates": 0, "env_restarts": 0}
        self.achievements = episode_metrics(cfg.env.id)  # e.g. Crafter's score and rates
        self.recent: list[float] = []  # the last 10 episodes' returns (run.target_return)
        self._offset = 0  # updates_due's, after a resume that changed the ratio
        if resume:
            self._restore(*loaded)
        if self.dist is not None:
            self.dist.attach(self.agent)  # rank 0's parameters; gradients averaged over ranks
        self.collector = self._make_collector() if learn else None
        if self.dist is not None:
            self.dist.barrier()  # every rank started (a rank that failed never gets here)
            failed = None
            if late:
                try:
                    self.replay = self._make_replay()
                except Exception as exc:  # noqa: BLE001 - every rank hears of it, below
                    failed = exc
            # ranks that made their replay stop too when one could not (no disk space, no
            # memory), so that none trains on alone and rank 0 takes the directory away
            if self.dist.any(failed is not None):
                raise failed or RuntimeError(
                    "another data-parallel rank could not make its replay; its error is in "
                    "that rank's output")
        # A resume's run.steps and settings, once it has started (a failed one writes
        # nothing) and where it goes on (a --steps below the steps done trains nothing)
        if resume and learn and self.rank == 0 and cfg.run.steps > self.counters["env_steps"]:
            self.write_config()
        self._restarts_before = self.counters["env_restarts"]
        self._stop = False
        self.videos_logged_at: int | None = None  # env steps of the last periodic videos
        self.signalled: int | None = None  # SIGINT / SIGTERM that stopped the last run()
        self.stop_reason: str | None = None  # why the last run() ended before run.steps
        self._batches: Prefetcher | None = None  # the learner's batch source, made by run()
        self._sampling = False  # the replay holds a window (on every rank): _can_sample

    def _hold(self) -> None:
        """One training process per run directory: a learning run's rank 0 locks it (a second
        process is refused with the first one's pid) until close()."""
        if self._learn and self.rank == 0 and self._lock is None and self.run_dir.is_dir():
            lock = ckpt.RunLock(self.run_dir)
            lock.acquire()
            self._lock = lock

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _new_run_dir(self, given: Path | None) -> Path:
        """Rank 0 claims the directory; a refusal reaches every rank."""
        claim: str | ConfigError | None = None
        if self.rank == 0:
            existed = given is not None and given.exists()
            try:
                claim = str(claim_run_dir(given, self.cfg))
            except ConfigError as exc:
                claim = exc
            else:
                self._made_dir = None if existed else Path(claim)
        if self.dist is not None:
            claim = self.dist.broadcast_object(claim)
        if isinstance(claim, ConfigError):
            raise claim
        return Path(claim)

    def _discard_failed_start(self) -> None:
        """A new run that fails to start (after its directory was made: an env runner that
        cannot be built, say) takes the directory away again when it holds nothing but what
        the start wrote (config.yaml, and a memory-mapped replay's empty ring files), so that
        failed starts do not pile up under runs/. Only while this process holds the
        directory's lock: a start that lost the lock to another process leaves it alone."""
        d = self._made_dir
        if d is None or self._lock is None or not d.is_dir():
            return
        files = [p for p in d.rglob("*") if not p.is_dir()]
        # ring files: replay/ring/, replay/runner-<i>/ring/ (Ray), replay-rank<r>/ring/
        if all((p.parent == d and p.name in ("config.yaml", ckpt.RunLock.NAME))
               or (p.parent.name == "ring" and p.suffix == ".npy") for p in files):
            shutil.rmtree(d, ignore_errors=True)

    def _saved_config(self) -> tuple[Config, tuple[dict, Path] | None]:
        """The run's config.yaml, or where that file is missing or empty (a disk that filled
        up), the config stored in its newest checkpoint; and that checkpoint, when read."""
        path = self.run_dir / "config.yaml"
        text = path.read_text() if path.is_file() else ""
        if text.strip():
            return from_yaml(text, where=str(path)), None
        if self.run_dir.is_file():
            raise FileNotFoundError(f"{self.run_dir} is a file; give the run's directory "
                                    f"(the one that holds config.yaml and checkpoints/)")
        if not ckpt.list_checkpoints(self.run_dir):
            raise FileNotFoundError(
                f"{self.run_dir} is not a lucid run: it has no config.yaml and no checkpoints/"
                + ("" if self.run_dir.is_dir() else " (the directory does not exist)"))
        payload, found = loaded = ckpt.load_latest(self.run_dir,
                                                   set_aside=self._learn and self.rank == 0)
        print(f"note: {path} is {'empty' if path.is_file() else 'missing'}; using the config "
              f"stored in {found}")
        return from_yaml(payload["config"], where=f"the config stored in {found}"), loaded

    # ------------------------------------------------------------------ persistence

    def save(self) -> Path:
        """Append the new replay steps to disk, then write a complete checkpoint atomically.
        A kill at any moment leaves the previous checkpoint and all earlier chunks intact."""
        self.replay.flush()
        if self.rank != 0:  # data-parallel: only rank 0 checkpoints (ranks > 0 keep replays)
            return None
        payload = {
            "agent": self.agent.state_dict(),
            "counters": dict(self.counters),
            "rng": ckpt.rng_state(),
            "replay_rng": self._replay_rng_state(),
            "replay_count": self.replay.count,
            "schedule": self._schedule(),
            "recent_returns": list(self.recent),
            "achievements": self.achievements.state_dict(),
            "config": to_yaml(self.cfg),
        }
        return ckpt.save_checkpoint(self.run_dir, payload, keep=self.cfg.run.keep_checkpoints)

    def _replay_rng_state(self) -> dict:
        if self._batches is not None:  # not the state after the prefetched batch
            return self._batches.rng_state()
        with self.replay.lock:
            return self.replay.rng_state()

    def _restore(self, payload: dict, path: Path) -> None:
        """The checkpoint `payload` (read on the CPU by _build) and the replay on disk."""
        self.agent.load_state_dict(payload["agent"])
        self.counters.update(payload["counters"])
        self._resume_schedule(payload.get("schedule"))
        self.recent = [float(r) for r in payload.get("recent_returns", [])]
        if "achievements" in payload:
            self.achievements.load_state_dict(payload["achievements"])
        restored = self.replay.restore(set_aside=self._learn)  # each rank's own directory
        if self.rank == 0:
            ckpt.set_rng_state(payload["rng"])
            self.replay.set_rng_state(payload["replay_rng"])
        else:  # data-parallel: only rank 0's streams are saved; the others draw new ones,
            # not rank 0's (nor their own start's again)
            seq = np.random.SeedSequence([self.cfg.run.seed, self.rank,
                                          self.counters["env_steps"]])
            seed_everything(int(seq.generate_state(1)[0]))
            self.replay.reseed(seq.spawn(1)[0])
        print(f"{'resumed from' if self._learn else 'loaded'} {path} at "
              f"{self.counters['env_steps']} env steps, "
              f"{self.counters['updates']} updates; replay holds {restored} steps per env")
        if self._learn and self.rank == 0:  # rows a killed run logged after its checkpoint
            self._purge_logs_after = self.counters["env_steps"]

    # ------------------------------------------------------------------ loop

    def updates_due(self, env_steps: int | None = None) -> int:
        """Updates that the env steps so far (or `env_steps`) call for: train_ratio replayed
        steps per env step after prefill (from where a resume changed the ratio or the batch:
        `_offset`)."""
        t = self.cfg.train
        since = (self.counters["env_steps"] if env_steps is None else env_steps) - t.prefill
        if since <= 0:
            return 0
        return math.floor(since * t.train_ratio / self._replayed_per_update()) + self._offset

    def _replayed_per_update(self) -> int:
        # env_steps counts all ranks' steps; each update replays B·T steps on every rank
        world = self.dist.world if self.dist else 1
        return self.cfg.train.batch_size * self.cfg.train.batch_length * world

    def _schedule(self) -> dict:
        return {"train_ratio": self.cfg.train.train_ratio, "prefill": self.cfg.train.prefill,
                "replayed_per_update": self._replayed_per_update(), "offset": self._offset}

    def _resume_schedule(self, saved: dict | None) -> None:
        """A resume that changed train.train_ratio, train.prefill, the batch or the number of
        data-parallel learners continues the updates at the new ratio from the updates done,
        not as if the whole run had had it (a burst of updates without new data, or none
        for long)."""
        self._offset = saved["offset"] if saved else 0
        now = self._schedule()
        if saved is None:
            return
        was = {**now, **saved}  # checkpoints before 2026-12-03 lack the prefill: unchanged
        if all(was[k] == now[k] for k in ("train_ratio", "prefill", "replayed_per_update")):
            return
        self._offset = 0
        self._offset = self.counters["updates"] - self.updates_due()
        if self.rank == 0 and self._learn:
            print(f"note: the train schedule changed on resume (train_ratio "
                  f"{was['train_ratio']:g} -> {now['train_ratio']:g}, prefill {was['prefill']} "
                  f"-> {now['prefill']}, replayed steps per update "
                  f"{was['replayed_per_update']} -> {now['replayed_per_update']}); updates go "
                  f"on at the new ratio from {self.counters['updates']:,}")

    def _can_sample(self) -> bool:
        """Whether the replay holds a window, on every data-parallel rank (an update is
        collective: with Ray runners ranks fill at their own pace); once true, true."""
        if not self._sampling:
            ok = self.replay.can_sample(self.cfg.train.batch_length)
            self._sampling = ok if self.dist is None else not self.dist.any(not ok)
        return self._sampling

    def _handle_signal(self, signum, frame):
        if self.signalled is not None and signum == signal.SIGINT:  # a second Ctrl-C: stop
            raise KeyboardInterrupt                                  # now (with a checkpoint)
        if self.signalled is not None:  # SIGTERM again: a launcher (make, timeout, a
            return  # scheduler) that signals a whole process group reaches a run twice
        self._stop = True
        self.stop_reason = signal.Signals(signum).name
        self.signalled = signum  # for the caller: `lucid train` reports it and exits 128 + N

    def run(self, callback=None, end_videos: bool = False) -> Path:
        """Train until `run.steps` env steps (or the time limit, the target return, SIGINT /
        SIGTERM, or `callback(info)` returning False (or 0, np.False_; not None) after an
        episode), then checkpoint. `end_videos`: then also an evaluation episode's and a
        dream's video (videos/, TensorBoard, W&B), unless a signal stopped the run."""
        if self.collector is None:
            raise RuntimeError("this Trainer was loaded with learn=False (to evaluate); "
                               "load it with learn=True to train")
        self._notes()
        s = self._open_session()
        # Ctrl-C and SIGTERM stop with a checkpoint; Python lets only the main thread handle
        # signals (learn() on another thread: a GUI, Ray Tune), so elsewhere they do not
        main = threading.current_thread() is threading.main_thread()
        old_handlers = {sig: signal.signal(sig, self._handle_signal)
                        for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
        try:
            while self.counters["env_steps"] < self.cfg.run.steps and not self._stopping():
                finished = self._collect_once()  # act in the envs; their steps to the replay
                self._episodes_ended(s, finished, callback)
                self._train_due(s)  # the updates the train ratio asks for by now
                self._on_schedule(s)  # log, evaluate, videos, checkpoint, as they fall due
            self._close_session(s, end_videos)
        except (EnvError, NonFiniteError):
            raise  # saved already
        except OSError as exc:
            if not ckpt.disk_full(exc):
                self._save_after(exc)
                raise
            raise self._disk_full(exc) from None  # another checkpoint would not fit either
        except BaseException as exc:  # a second Ctrl-C, a raising callback, a bug: keep the run
            self._save_after(exc)
            raise
        finally:
            self._batches.close()
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            s.logger.close()
        return self.run_dir

    # The steps of run(), in its order.

    def _notes(self) -> None:
        """What the user should know before a run starts (rank 0 says it)."""
        cfg, t, c, a = self.cfg, self.cfg.train, self.counters, self.act_spec
        if self.rank != 0:
            return
        envs = cfg.env.num_envs * (self.dist.world if self.dist else 1)  # env_steps' streams
        if c["env_steps"] < cfg.run.steps <= t.prefill:
            print(f"note: run.steps={cfg.run.steps} ends within the {t.prefill} random-action "
                  f"steps of train.prefill, so no update will be made; raise --steps or lower "
                  f"train.prefill")
        elif c["env_steps"] < cfg.run.steps < envs * t.batch_length \
                and cfg.run.runners == "local":  # (a window lies within one env's steps)
            print(f"note: run.steps={cfg.run.steps} gives each of the {envs} env(s) "
                  f"{cfg.run.steps // envs} steps, fewer than one train.batch_length="
                  f"{t.batch_length} window, so no update will be made; raise --steps or "
                  f"lower train.batch_length")
        elif c["env_steps"] < cfg.run.steps and self.updates_due(cfg.run.steps) <= c["updates"]:
            steps = cfg.run.steps - max(c["env_steps"], t.prefill)  # those that train
            print(f"note: {steps} env steps after train.prefill at train.train_ratio="
                  f"{t.train_ratio:g} call for {steps * t.train_ratio:g} replayed steps, fewer "
                  f"than the {self._replayed_per_update()} of one update, so no update will be "
                  f"made; raise --steps or train.train_ratio, or lower train.batch_size")
        if c["env_steps"] == 0 and (gpu := gpu_speed_note(
                self.agent.config, self.device, data_parallel=bool(self.dist))):
            print(f"note: {gpu}")
        if c["env_steps"] < cfg.run.steps and (slow := compile_note(self.agent.config,
                                                                     self.device)):
            print(f"note: {slow}")
        if (c["env_steps"] == 0 and not a.is_discrete and not a.is_continuous
                and t.continuous_grad == "dynamics"):
            print("note: the action space has discrete and Box actions, so the actor learns "
                  "all of them by REINFORCE, as the authors' current code does "
                  "(train.continuous_grad=dynamics applies to Box-only spaces)")

    def _open_session(self) -> "_Session":
        """The logger, the clocks and the batch source of one run() call."""
        cfg, c = self.cfg, self.counters
        self._stop, self.signalled, self.stop_reason = False, None, None
        logger = Logger(self.run_dir, progress=cfg.run.progress, total_steps=cfg.run.steps,
                        start_steps=c["env_steps"], config=cfg,
                        purge_after=self._purge_logs_after) \
            if self.rank == 0 else _QuietLogger()
        if self._purge_logs_after is not None:
            from .video import set_aside_videos_after
            if moved := set_aside_videos_after(self.run_dir, self._purge_logs_after):
                print(f"note: {len(moved)} videos of steps past the checkpoint moved to "
                      f"{moved[0].parent}")
        self._purge_logs_after = None
        # Batches for the updates: sampled on a background thread with train.prefetch.
        self._batches = Prefetcher(self.replay, cfg.train.batch_size, cfg.train.batch_length,
                                   self.device, background=self.agent.config.train.prefetch)
        now = time.time()
        self._session_start = now  # run.time_limit counts from here

        def next_multiple(every: int) -> int | None:
            return (c["env_steps"] // every + 1) * every if every else None

        return _Session(logger=logger, start=now - c["wall_time"], last_log=now,
                        last_ckpt=now, last_ckpt_steps=c["env_steps"],
                        log_steps=c["env_steps"], log_updates=c["updates"],
                        next_eval=next_multiple(cfg.run.eval_every),
                        next_video=next_multiple(cfg.run.video_every),
                        endless_noted=c["episodes"] > 0)

    def _collect_once(self) -> list:
        """One collection step (random actions during prefill); a bad env step stops the run
        with a checkpoint (the step never reached the replay). Returns finished episodes."""
        c = self.counters
        policy = None if c["env_steps"] < self.cfg.train.prefill else self.agent
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

    def _episodes_ended(self, s: "_Session", finished: list, callback) -> None:
        """Log the finished episodes and ask the callback whether to go on."""
        c = self.counters
        if not s.endless_noted and c["env_steps"] >= NO_EPISODE_NOTE:
            s.endless_noted = True
            if not (c["episodes"] or finished) and self.rank == 0:
                print(f"note: no episode has ended in {c['env_steps']:,} env steps; "
                      f"if this env has no time limit, give it one "
                      f"(env.max_episode_steps=N): returns, episodes.jsonl and "
                      f"evaluations come from finished episodes")
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
                    self._stop, self.stop_reason = True, "the callback returned False"

    def _train_due(self, s: "_Session") -> None:
        """Update until the updates reach what the train ratio allows for the env steps so
        far. Metrics stay on the device (summed until the next log row); the count of
        non-finite steps is the one value read back per update."""
        c, t = self.counters, self.cfg.train
        while c["updates"] < self.updates_due() and self._can_sample():
            batch = self._batches.get()  # timed: perf/batch_wait_ms
            metrics = self.agent.train_step(batch)
            if metrics["train/nonfinite_steps"] > 0:
                c["nonfinite_updates"] += 1
                s.bad_in_row += 1
                if s.bad_in_row >= t.max_nonfinite:
                    self.save()  # skipped steps changed nothing: the last good state
                    raise NonFiniteError(
                        f"{s.bad_in_row} updates in a row had non-finite losses or "
                        f"gradients (at {c['env_steps']} env steps); stopped with a "
                        f"checkpoint of the last good state in {self.run_dir}. Check "
                        f"the environment's observations and rewards, or lower the "
                        f"learning rates")
            else:
                s.bad_in_row = 0
            for k, v in metrics.items():
                s.sums[k] = s.sums[k] + v.detach() if k in s.sums else v.detach()
            s.n_sums += 1
            c["updates"] += 1
            every_check = self.cfg.run.dist_check_every
            if self.dist is not None and every_check and c["updates"] % every_check == 0:
                self.dist.check_identical(self.agent)

    def _on_schedule(self, s: "_Session") -> None:
        """What falls due by now: a metric row, an evaluation, videos, a checkpoint."""
        cfg, c = self.cfg, self.counters
        now = time.time()
        c["wall_time"] = now - s.start
        c["env_restarts"] = self.collector.restarts + self._restarts_before  # for the row
        if now - s.last_log >= cfg.run.log_every:
            self._log_row(s, now)
        if s.next_eval is not None and c["env_steps"] >= s.next_eval and self.rank == 0:
            self._evaluate(s.logger, s.start)
            s.next_eval += cfg.run.eval_every
        if s.next_video is not None and c["env_steps"] >= s.next_video and self.rank == 0:
            self._videos(s.logger)
            s.next_video += cfg.run.video_every
        every = cfg.run.checkpoint_every
        if (now - s.last_ckpt >= cfg.run.checkpoint_minutes * 60
                or (every and c["env_steps"] - s.last_ckpt_steps >= every)):
            self.save()
            s.last_ckpt, s.last_ckpt_steps = now, c["env_steps"]

    def _log_row(self, s: "_Session", now: float) -> None:
        c = self.counters
        s.logger.metrics(self._row(s.sums, s.n_sums, now - s.last_log, s.log_steps,
                                   s.log_updates))
        s.sums, s.n_sums = {}, 0
        s.last_log, s.log_steps, s.log_updates = now, c["env_steps"], c["updates"]

    def _close_session(self, s: "_Session", end_videos: bool) -> None:
        """The last metric row, a checkpoint, and the end-of-run videos."""
        c = self.counters
        now = time.time()
        c["wall_time"] = now - s.start
        if s.n_sums:
            self._log_row(s, now)
        if self.dist is not None:
            self.dist.check_identical(self.agent)
        self.save()
        if end_videos and not self._stop and self.rank == 0 \
                and self.videos_logged_at != c["env_steps"]:
            print("writing the end-of-run videos ...", flush=True)
            self._videos(s.logger)  # while the run's loggers are open (one W&B session)

    def _save_after(self, exc: BaseException) -> None:
        try:
            path = self.save()
        except Exception as again:  # noqa: BLE001 - e.g. the disk is full: the older ones stay
            print(f"warning: could not save a checkpoint after {type(exc).__name__} "
                  f"({type(again).__name__}: {again}); the previous checkpoints are intact")
            return
        if path is not None:
            print(f"stopped by {type(exc).__name__}: saved {path}; continue with "
                  f"{self.resume_hint()}")

    def resume_hint(self) -> str:
        return resume_hint(self.cfg.env.id, self.run_dir)

    def write_config(self) -> None:
        """RUN_DIR/config.yaml: the run's config, run.steps saying how far it goes."""
        ckpt.atomic_write_text(self.run_dir / "config.yaml", to_yaml(self.cfg))

    def _disk_full(self, exc: OSError) -> DiskFullError:
        saved = ckpt.list_checkpoints(self.run_dir)
        then = (f"its newest checkpoint, {saved[-1].name}, and the replay on disk are intact. "
                f"Free some space (old runs, videos/, a lower run.keep_checkpoints or "
                f"train.replay_capacity) and continue with {self.resume_hint()}"
                if saved else "it had no checkpoint yet; free some space and start it again "
                "in a new run directory")
        err = DiskFullError(
            f"the disk under {self.run_dir} is full ({exc.strerror} writing "
            f"{exc.filename or 'a file'}, at {self.counters['env_steps']} env steps); the run "
            f"stopped and {then}")
        err.errno = exc.errno
        return err

    def close(self) -> None:
        """Close the env runners, leave the process group, release the directory's lock."""
        collector, self.collector = self.collector, None
        try:
            if collector is not None:
                close_env(collector, env_label(self.cfg.env.id))
            if self.dist is not None:
                self.dist.close()
        finally:  # the directory is released whatever else failed
            self._release()
            self.closed = True

    def __enter__(self) -> "Trainer":  # `with Trainer(cfg) as tr: tr.run()` closes it after
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ scale-out

    def _make_replay(self, build: bool = True):
        """One Replay over env.num_envs streams, or with Ray runners a ReplayGroup with one
        part per runner. Data-parallel ranks > 0 keep theirs in replay-rank<r>/. A replay
        that could never give a window is refused before anything is built; `build=False`
        checks that only."""
        cfg, t = self.cfg, self.cfg.train
        directory = None if self.run_dir is None else \
            self.run_dir / ("replay" if self.rank == 0 else f"replay-rank{self.rank}")
        seed = cfg.run.seed + 7919 * self.rank
        # A run loaded to evaluate or dream with (learn=False) reads its newest VIEW_STEPS
        # into memory and writes nothing: a memory-mapped ring may be a live run's.
        capacity = t.replay_capacity if self._learn else min(t.replay_capacity, VIEW_STEPS)
        kw = dict(chunk_length=t.replay_chunk, memmap=t.replay_memmap and self._learn)
        max_bytes = int(t.replay_max_gb * 2**30)
        if cfg.run.runners != "ray":  # (capacity, envs, seed, directory, max bytes) per part
            parts = [(capacity, cfg.env.num_envs, seed, directory, max_bytes)]
        else:
            n = cfg.run.num_runners
            parts = [(capacity // n, cfg.run.envs_per_runner, seed + 1 + i,
                      directory and directory / f"runner-{i}", max_bytes // n)
                     for i in range(n)]
        fields = Replay.space_fields(self.obs_spec, self.act_spec.dim)
        short = min(Replay.steps_per_env(fields, c, e, b) for c, e, _, _, b in parts)
        if self._learn and short < t.batch_length:  # no window could ever be drawn
            streams = (f"{cfg.run.num_runners} runners x {cfg.run.envs_per_runner} envs"
                       if cfg.run.runners == "ray" else f"env.num_envs={cfg.env.num_envs}")
            cap = f", train.replay_max_gb={t.replay_max_gb}" if t.replay_max_gb else ""
            raise ConfigError(
                f"the replay keeps {short} steps per env stream (train.replay_capacity="
                f"{t.replay_capacity:,}{cap}, {streams}), "
                f"fewer than train.batch_length={t.batch_length}, so no update could ever "
                f"run: raise train.replay_capacity or train.replay_max_gb, or use fewer envs")
        if not build:
            return None
        replays = [Replay(c, e, fields, s, directory=d, max_bytes=b, **kw)
                   for c, e, s, d, b in parts]
        if cfg.run.runners != "ray":
            return replays[0]
        from .replay import ReplayGroup
        return ReplayGroup(replays, seed)

    def _make_collector(self):
        cfg = self.cfg
        # A resumed run's envs and random actions differ from the run's start (also when
        # it resumes during prefill, before any update)
        seed = (cfg.run.seed + 1000 * self.counters["updates"] + self.counters["env_steps"]
                + 7919 * self.rank)
        if cfg.run.runners == "ray":
            from .ray_runners import RayCollector
            return RayCollector(cfg, seed=seed)
        make = env_fn(cfg.env.id, cfg.env.max_episode_steps, **cfg.env.kwargs)
        fns = [restarting(make, cfg.env.max_restarts)] * cfg.env.num_envs
        return Collector(fns, self.obs_spec, self.act_spec, cfg.env.asynchronous, seed=seed)

    def _collect(self, policy) -> tuple[int, list]:
        """New experience into the replay: local vector-env step or the next Ray runner
        chunk. Returns the env steps added (summed over data-parallel ranks) and this
        process's finished episodes."""
        if isinstance(self.collector, Collector):
            record, finished = self.collector.step(policy)
            self.replay.add(record)
            n = self.collector.n
        else:
            n, finished = self.collector.collect(policy, self.replay)
        if self.dist is not None:  # every rank counts the same steps, so does the same updates
            n = int(self.dist.sum(n))
        return n, finished

    def _stopping(self) -> bool:
        """Stop on a signal, the callback, the time limit or the target return; data-parallel
        ranks stop together when any of them would."""
        stop = self._stop or self._done()
        if self.dist is None:
            return stop
        if self.dist.any(stop) and not stop:
            self.stop_reason = self.stop_reason or "another data-parallel rank stopped " \
                "(its run.target_return, time limit or signal)"
            return True
        return stop

    def _done(self) -> bool:
        """Stop early on the time limit of this session (a resumed run gets its own) or once
        the target return is reached; `stop_reason` says which."""
        run = self.cfg.run
        if run.time_limit and time.time() - self._session_start >= run.time_limit * 60:
            self.stop_reason = f"run.time_limit={run.time_limit:g} minutes reached"
            return True
        if (run.target_return is not None and len(self.recent) >= 10
                and float(np.mean(self.recent)) >= run.target_return):
            self.stop_reason = (f"run.target_return={run.target_return:g} reached (mean of "
                                f"the last 10 episodes {float(np.mean(self.recent)):.4g})")
            return True
        return False

    def _row(self, sums, n, dt, log_steps, log_updates) -> dict:
        c = self.counters
        row = {"env_steps": c["env_steps"], "updates": c["updates"], "episodes": c["episodes"],
               "wall_time": round(c["wall_time"], 2),
               "perf/env_steps_per_s": (c["env_steps"] - log_steps) / max(dt, 1e-9),
               "perf/updates_per_s": (c["updates"] - log_updates) / max(dt, 1e-9),
               "replay/steps": len(self.replay),
               "train/nonfinite_updates": c["nonfinite_updates"],
               "train/env_restarts": c["env_restarts"]}
        wait = self._batches.wait_ms() if self._batches is not None else None
        if wait is not None:  # mean time an update waited for its batch (sampling included
            row["perf/batch_wait_ms"] = wait  # without train.prefetch)
        if hasattr(self.collector, "metrics"):  # Ray runners: policy lag, restarts
            row.update(self.collector.metrics())
        if self.dist is not None:  # data-parallel learners
            row.update({"dist/world_size": self.dist.world,
                        "dist/param_checks": self.dist.checks})
        if n:
            keys = list(sums)
            vals = (torch.stack([sums[k].float() for k in keys]) / n).cpu().tolist()
            row.update(dict(zip(keys, vals)))
        row.update(self.achievements.metrics())
        if self.recent:
            row["episode/return_recent"] = float(np.mean(self.recent))
        return row

    def evaluate(self, episodes: int, explore: bool = False, seed: int | None = None):
        """Full episodes in a fresh env of this run with the greedy (or sampled) policy."""
        cfg = self.cfg
        return evaluate(self.agent, env_fn(cfg.env.id, cfg.env.max_episode_steps, **cfg.env.kwargs),
                        self.obs_spec, self.act_spec, episodes, explore=explore,
                        seed=cfg.run.seed + 10_000 if seed is None else seed)

    def _videos(self, logger: Logger) -> None:
        from .video import log_videos
        self.videos_logged_at = self.counters["env_steps"]  # finish_run does not repeat them
        try:
            logger.videos(log_videos(self, logger.tb, self.counters["env_steps"]),
                          self.counters["env_steps"])
        except Exception as exc:  # noqa: BLE001 - a video never costs the run
            warn(f"video logging failed: {type(exc).__name__}: {exc}")

    def _evaluate(self, logger: Logger, start: float) -> None:
        """The periodic evaluation; an env that fails there costs the evaluation, not the run."""
        for explore in (False, True):
            try:
                eps = self.evaluate(self.cfg.run.eval_episodes, explore,
                                    seed=self.cfg.run.seed + 10_000 + self.counters["env_steps"])
            except Exception as exc:  # noqa: BLE001 - any error of the env's (not Ctrl-C)
                warn(f"evaluation at {self.counters['env_steps']} env steps failed "
                     f"({type(exc).__name__}: {exc}); training goes on")
                return
            for ep in eps:
                logger.episode({"env_steps": self.counters["env_steps"], "return": ep.ret,
                                "length": ep.length, "wall_time": time.time() - start,
                                "eval": True, "policy": "sampled" if explore else "greedy"})


def train(cfg: Config, run_dir: str | Path | None = None, resume: bool = False) -> Path:
    trainer = Trainer(cfg, run_dir, resume)
    try:
        return trainer.run()
    finally:
        trainer.close()
