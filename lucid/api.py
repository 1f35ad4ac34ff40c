"""A small stable-baselines-like Python API over the trainer.

    from lucid import Dreamer
    agent = Dreamer("CartPole-v1")                # or Dreamer(MyEnv()), Dreamer("atari:Pong")
    agent.learn(20_000, callback=lambda info: info["return"] < 475)  # False stops learning
    action, state = agent.predict(obs, state)     # one env (no batch axis) or a batch
    agent.save("cartpole.pt"); agent = Dreamer.load("cartpole.pt")
"""

from __future__ import annotations

import numbers
import signal
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from .checkpoint import atomic_torch_save, load_checkpoint, load_latest, FORMAT_VERSION
from .config import ConfigError, as_dict, flatten, from_yaml, make_config, to_yaml
from .envs import env_label, instances
from .acting import ActingRun
from .device import load_here, preset_for
from .notes import preset_note
from .multiseed import SeedsTrainer
from .train import Trainer
from .warn import warn


def _env_id(env) -> str:
    """The config's env.id of an env name or instance (instances are registered)."""
    if not isinstance(env, gym.Env):
        return str(env)
    try:
        return instances.register(env)
    except Exception as exc:  # noqa: BLE001 - deepcopy of an env with live handles
        raise TypeError(f"cannot copy the env instance ({type(exc).__name__}: {exc}); pass it "
                        f"by name instead ('module.path:EnvClass' with its kwargs as "
                        f"env__kwargs)") from None


def _sections(overrides: dict, call: str) -> dict:
    """Config keyword arguments (section__key=value, or a dict per section) as sections."""
    sections: dict = {}
    for key, val in overrides.items():
        if "__" in key:  # a value, a dict too (env__kwargs={...})
            sec, _, name = key.partition("__")
            sections.setdefault(sec, {})[name] = val
        elif isinstance(val, dict):
            sections.setdefault(key, {}).update(val)
        else:
            raise ConfigError(f"{call}(..., {key}={val!r}): give config keys as "
                              f"section__key=value (e.g. train__train_ratio=64) or a dict "
                              f"per section (train={{'train_ratio': 64}})")
    return sections


def train_seeds(env, seeds, total_env_steps: int, preset: str | None = None,
                size: str | None = None, run_dir: str | Path | None = None,
                **overrides: Any) -> list[Path]:
    """Train several seeds of one config in one process, their updates batched into one
    (`lucid train ENV --seeds ...`, docs/scaling.md). `env`, `preset`, `size` and `overrides`
    as Dreamer's; `seeds` a list of ints. Returns the seeds' run directories
    (RUN_DIR/seed-S), each an ordinary run: `Dreamer.load(path)` acts with its agent."""
    sections: dict = _sections(overrides, "train_seeds")
    sections.setdefault("env", {})["id"] = _env_id(env)
    if size:
        sections.setdefault("model", {})["size"] = size
    sections.setdefault("run", {}).setdefault("progress", False)
    sections["run"]["steps"] = int(total_env_steps)
    preset = preset or preset_for(make_config("default", **sections))
    st = SeedsTrainer.start(make_config(preset, **sections), [int(s) for s in seeds], run_dir)
    try:
        st.run()
    finally:
        st.close()
    return [t.run_dir for t in st.trainers]


class Dreamer:
    def __init__(self, env, preset: str | None = None, size: str | None = None,
                 run_dir: str | Path | None = None, **overrides: Any):
        """`env` is an env name (any gymnasium id, a suite name such as `atari:Pong`,
        `module.path:EnvClass` or `path/to/file.py:EnvClass`) or a gymnasium.Env instance
        (trained on one copy of it, or N with env__num_envs=N; such a run cannot be resumed
        from the command line). `preset`
        defaults to the env's domain preset. `overrides` are config keys as
        section__key=value (e.g. train__train_ratio=64) or nested dicts per section
        (train={"train_ratio": 64}); the env section's keys only as env__key=value
        (env__num_envs=4, env__kwargs={...}), since `env` is the env itself."""
        if isinstance(env, type) and issubclass(env, gym.Env):
            raise TypeError(f"Dreamer got the class {env.__name__}; pass an instance "
                            f"({env.__name__}()) or a name such as 'my_module:{env.__name__}'")
        if isinstance(env, gym.vector.VectorEnv):
            raise TypeError("Dreamer got a vector env; pass one env (an instance or a name) "
                            "and set env__num_envs=N: lucid builds the vector env itself")
        instance = isinstance(env, gym.Env)
        if instance:
            env = _env_id(env)
        elif not isinstance(env, str):
            raise TypeError(f"env must be a gymnasium.Env or an env name, got "
                            f"{type(env).__name__}")
        sections: dict = _sections(overrides, "Dreamer")
        sections.setdefault("env", {})["id"] = env
        if instance:  # one copy of it unless env__num_envs=N asks for more
            sections["env"].setdefault("num_envs", 1)
        if size:
            sections.setdefault("model", {})["size"] = size
        sections.setdefault("run", {}).setdefault("progress", False)
        preset_given = preset is not None
        preset = preset or preset_for(make_config("default", **sections))
        self.cfg, self._run_dir = make_config(preset, **sections), run_dir
        # An agent to act with until the first learn(), which claims the run directory:
        # constructing one to predict, evaluate or save writes no files.
        self.trainer = ActingRun(self.cfg)
        self.agent = self.trainer.agent
        note = None if preset_given else preset_note(self.trainer.cfg, self.trainer.device,
                                                        "preset='{}'")
        if note:
            warn(note)

    def learn(self, total_env_steps: int, callback=None) -> "Dreamer":
        """Train for `total_env_steps` more env steps. `callback(info)` is called after every
        finished training episode with a dict of the counters, `return`, `length` and
        `info` (the env's info of the episode's last step, e.g. a success flag, also from Ray
        runners);
        returning a false value (False, 0, np.False_; not None) stops learning (with a
        checkpoint). Ctrl-C or SIGTERM stops it with a checkpoint too, then reaches the
        program as it would have (KeyboardInterrupt for Ctrl-C). After close(), learn()
        continues the run from its last checkpoint."""
        if isinstance(total_env_steps, float) and total_env_steps.is_integer():
            total_env_steps = int(total_env_steps)  # learn(1e5)
        if not isinstance(total_env_steps, numbers.Integral) or isinstance(total_env_steps, bool) \
                or total_env_steps < 0:
            raise ValueError(f"learn() takes a whole number of env steps >= 0, got "
                             f"{total_env_steps!r}")
        if callback is not None and not callable(callback):  # not at an episode's end
            raise TypeError(f"learn(callback=...) takes a function of the episode's info "
                            f"dict, or None; got {type(callback).__name__}")
        if isinstance(self.trainer, ActingRun):  # made or loaded to act: its run starts now
            self._start_run()
        elif self.trainer.closed:  # a run close()d: go on from its last checkpoint
            self._reopen()
        self.trainer.cfg.run.steps = self.trainer.counters["env_steps"] + int(total_env_steps)
        # config.yaml says how far this run goes, as for `lucid train --steps`, so a resume
        # from the command line without --steps stops where this learn() would have
        self.trainer.write_config()
        self.trainer.run(callback=callback)
        if self.trainer.signalled is not None:  # saved: now the program's own handling
            print(f"interrupted at {self.trainer.counters['env_steps']:,} of "
                  f"{self.trainer.cfg.run.steps:,} env steps; a checkpoint is in "
                  f"{self.trainer.run_dir}", flush=True)
            sys.stderr.flush()  # a default SIGTERM ends the process without flushing
            signal.raise_signal(self.trainer.signalled)
        return self

    @property
    def run_dir(self) -> Path | None:
        """The run directory: where checkpoints, logs and videos go; None until learn()."""
        return None if self.trainer.run_dir is None else Path(self.trainer.run_dir)

    def predict(self, obs, state=None, deterministic: bool = False, episode_start=None):
        """Action(s) for one observation (no batch axis) or a batch of N; returns
        (action, state). Pass the returned state back with the next observation. With
        state=None every row starts a new episode; `episode_start` (a bool, or N bools)
        marks the rows whose episode starts at this observation, as after a reset."""
        spec = self.trainer.obs_spec
        top_tuple = any(isinstance(p[0], int) for p in spec.paths.values() if p)
        if isinstance(obs, tuple) and len(obs) == 2 and isinstance(obs[1], dict) \
                and not top_tuple:
            raise TypeError("predict got a pair (observation, info), as env.reset() returns "
                            "it; pass the observation alone: obs, info = env.reset()")
        n = spec.batch_of(obs)
        batched = n is not None
        if n == 0:
            raise ValueError("predict got a batch of 0 observations; pass one observation or "
                             "a batch of N >= 1")
        spec.check(obs, (n,) if batched else ())  # as strict as training, and named
        arrays = spec.convert(obs, (n,) if batched else ())
        if not batched:
            arrays, n = {k: v[None] for k, v in arrays.items()}, 1
        if state is not None:
            blank = self.agent.initial(1)  # the agent's kind of state (each recipe has its own)
            if not isinstance(state, type(blank)):
                raise TypeError(f"predict(state=...) takes the state a previous predict "
                                f"returned (or None), got {type(state).__name__}")
            if state.h.shape[0] != n:
                raise ValueError(f"predict got a state for {state.h.shape[0]} env(s) and "
                                 f"{n} observation(s); keep one state per batch size, or pass "
                                 f"state=None to start new episodes")
            want = tuple(tuple(x.shape[1:]) for x in (blank.h, blank.z, blank.action))
            if (tuple(state.h.shape[1:]), tuple(state.z.shape[1:]),
                    tuple(state.action.shape[1:])) != want:  # another agent's
                raise ValueError(f"predict got a state of another model (h, z and action of "
                                 f"{tuple(state.h.shape[1:])}, {tuple(state.z.shape[1:])}, "
                                 f"{tuple(state.action.shape[1:])}; this agent's are "
                                 f"{', '.join(map(str, want))}): pass the state this agent's "
                                 f"predict returned, or None")
        tensors = {k: torch.as_tensor(v, device=self.agent.device) for k, v in arrays.items()}
        starts = None
        if episode_start is not None:
            starts = np.asarray(episode_start)
            if starts.dtype != bool or starts.shape not in ((), (n,)):
                raise ValueError(f"predict(episode_start=...) takes a bool or {n} bools, got "
                                 f"{episode_start!r}")
            starts = torch.as_tensor(np.broadcast_to(starts, (n,)).copy(),
                                     device=self.agent.device)
        action, state = self.agent.policy(tensors, state, not deterministic, starts)
        env_action = self.trainer.act_spec.to_env(action.cpu().numpy())
        return (env_action if batched else self.trainer.act_spec.item(env_action, 0)), state

    def evaluate(self, episodes: int = 10, deterministic: bool = True,
                 return_lengths: bool = False) -> list[float] | tuple[list[float], list[int]]:
        """Returns of `episodes` episodes in a fresh env (greedy unless deterministic=False);
        with return_lengths=True, `(returns, lengths)`."""
        if not isinstance(episodes, numbers.Integral) or episodes < 1:
            raise ValueError(f"evaluate() takes a whole number of episodes >= 1, got "
                             f"{episodes!r}")
        eps = self.trainer.evaluate(episodes, explore=not deterministic)
        rets = [e.ret for e in eps]
        return (rets, [e.length for e in eps]) if return_lengths else rets

    def save(self, path: str | Path) -> None:
        """The agent (weights, optimizers, config, counters) in one file, for `load`; its
        directory is made if missing."""
        path = Path(path).expanduser()
        if path.is_dir():
            raise IsADirectoryError(f"{path} is a directory; save() writes one file: give a "
                                    f"file name, e.g. {path / 'agent.pt'}")
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_torch_save({"format_version": FORMAT_VERSION, "config": to_yaml(self.cfg),
                           "agent": self.agent.state_dict(),
                           "counters": dict(self.trainer.counters)}, path)

    def close(self) -> None:
        """Close the envs and release the run directory (which a Dreamer holds from its
        first learn(), so that no second process trains in it). `with Dreamer(...) as
        agent:` too."""
        self.trainer.close()

    def __enter__(self) -> "Dreamer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @classmethod
    def load(cls, path: str | Path, run_dir: str | Path | None = None,
             device: str = "auto", env=None, resume: bool = False,
             **overrides: Any) -> "Dreamer":
        """An agent saved with `save`, or a run directory's newest checkpoint, on `device`
        when given, else on its own device where this machine has it, else on auto's choice
        (a GPU-trained agent loads on a CPU). Further learning goes to `run_dir`, else to a
        fresh directory, made at the first learn(), with an empty replay: the saved run's
        own files are never written to. With `resume`, `path` is a run directory and
        learning continues in it, with its replay, counters and logs, as `lucid train
        --resume` does. `env` (a name or an instance) replaces the saved env; an agent
        trained on an env instance needs one, since a checkpoint holds only the env's name.
        A resumed run goes on in its own env: `env` is refused there unless the run was
        trained on an instance (then its spaces must fit) or names the run's env.
        `overrides` change the saved config as Dreamer's do (train__actor_lr=1e-4, to go on
        learning with other settings; networks of other shapes are refused with the
        checkpoint); a resume takes the keys that `lucid train --resume` may change
        (lucid.config.RESUME_SETTABLE: run__steps, run__eval_every, ...)."""
        path = Path(path).expanduser()
        sections = _sections(overrides, "Dreamer.load")
        if resume:
            return cls._resume(path, run_dir, device, env, sections)
        if path.is_dir() and not (path / "checkpoints").is_dir():
            raise FileNotFoundError(f"{path} is neither a checkpoint file nor a run directory "
                                    f"(it has no checkpoints/)")
        payload = load_latest(path)[0] if path.is_dir() else load_checkpoint(path)
        cfg = from_yaml(payload["config"], where=f"the config stored in {path}")
        if sections:  # the saved config, then these (validated as a new config is)
            tree = as_dict(cfg)
            cfg = make_config(tree.pop("preset"), overrides=sections, **tree)
        if env is not None:
            cfg.env.id = _env_id(env)
        elif instances.is_instance(cfg.env.id):
            cls_name = env_label(cfg.env.id)
            raise ValueError(f"{path} was trained on an env instance (Dreamer({cls_name}(...))),"
                             f" which a checkpoint cannot hold; pass the env again: "
                             f"Dreamer.load(path, env={cls_name}(...))")
        load_here(cfg, device)
        cfg.run.run_dir = None
        self = cls.__new__(cls)
        self.cfg, self._run_dir = cfg, run_dir
        self.trainer = ActingRun(cfg)  # no directory until learn()
        self.trainer.agent.load_state_dict(payload["agent"])
        self.trainer.counters.update(payload.get("counters", {}))
        self.agent = self.trainer.agent
        return self

    def _reopen(self) -> None:
        """The run of a learning agent that was closed, resumed from its last checkpoint
        (written when its learn() ended) with its replay and the directory's lock."""
        closed = self.trainer
        self.trainer = Trainer(make_config("default", run={"steps": 0,
                                                           "device": closed.cfg.run.device}),
                               closed.run_dir, resume=True)
        # the config as the run saves it: settings left to the device stay null
        self.cfg, self.agent = self.trainer.saved_config(), self.trainer.agent

    def _start_run(self) -> None:
        """The run of an agent made or loaded to act with: a directory (run_dir, else a
        fresh one), env runners and a replay, training `self.agent` itself (what was done
        to it, a hook or a swapped network, holds: the latter is refused), with the
        counters."""
        trainer = Trainer(self.cfg, self._run_dir, agent=self.agent)
        trainer.counters.update(self.trainer.counters)
        self.trainer = trainer

    @classmethod
    def _resume(cls, path: Path, run_dir, device: str, env, sections: dict) -> "Dreamer":
        if run_dir is not None and Path(run_dir) != path:
            raise ValueError(f"Dreamer.load(..., resume=True) learns on in {path} itself; "
                             f"leave out run_dir (or resume=False to learn into a new one)")
        if not path.is_dir():
            raise FileNotFoundError(f"Dreamer.load(..., resume=True) continues a run "
                                    f"directory; {path} is not one (resume=False loads a "
                                    f"checkpoint file)")
        self = cls.__new__(cls)
        given = make_config("default", overrides=sections, run={"steps": 0, "device": device})
        self.trainer = Trainer(given, path, resume=True, env=None if env is None else _env_id(env),
                               settings=tuple(flatten(sections)))
        self.cfg, self.agent = self.trainer.saved_config(), self.trainer.agent
        return self
