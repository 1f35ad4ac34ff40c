"""A run's agent to act with: to predict, evaluate and dream (`lucid eval`, `lucid dream`,
`Dreamer` before its first learn()). It starts no env runners, holds no lock and writes
nothing: a run may be loaded while it trains."""

from __future__ import annotations

from pathlib import Path

from .agents import agent_class
from .config import Config, make_config
from .device import chosen_for, resolve_device
from .envs import env_fn, episode_metrics
from .envs.checks import spaces_of
from .parts import make_replay, new_counters, resolve_ids, set_up_process
from .resume import restore, resumed_config
from .runner import evaluate
from .seeds import eval_seed, seed_everything


def evaluate_agent(agent, cfg: Config, obs_spec, act_spec, episodes: int,
                   explore: bool = False, seed: int | None = None):
    """Full episodes in a fresh env of `cfg` with the greedy (or sampled) policy."""
    return evaluate(agent, env_fn(cfg.env.id, cfg.env.max_episode_steps, **cfg.env.kwargs),
                    obs_spec, act_spec, episodes, explore=explore,
                    seed=eval_seed(cfg.run.seed) if seed is None else seed)


class ActingRun:
    """The agent of `cfg` with its spaces, device, counters and a replay read into memory
    (of `run_dir`'s newest steps, for dreams), restored from `loaded` (payload, path)."""

    collector = None  # it collects nothing
    signalled = None
    videos_logged_at = None  # (finish_run reads it: no periodic videos here)

    def __init__(self, cfg: Config, run_dir: Path | None = None,
                 loaded: tuple[dict, Path] | None = None):
        resolve_ids(cfg)
        self.run_dir, self.closed = run_dir, False
        self.device = resolve_device(cfg.run.device)
        # one config: the settings left to the device chosen (an agent that only acts is
        # not compiled), which is the agent's own
        self.cfg = cfg = chosen_for(cfg, self.device, learn=False)
        self.obs_spec, self.act_spec = spaces_of(cfg)
        agent_cls = agent_class(cfg)
        set_up_process(cfg, 0)
        self.agent = agent_cls(self.obs_spec, self.act_spec, cfg, self.device)
        self.replay = make_replay(cfg, self.obs_spec, self.act_spec, run_dir, learn=False)
        self.counters = new_counters()
        self.achievements = episode_metrics(cfg.env.id)
        self.recent: list[float] = []
        # what was loaded, in one line for a command to show (nothing is printed here)
        self.loaded = None if loaded is None else \
            restore(self, *loaded, rank=0, learn=False, reseed=seed_everything)

    def evaluate(self, episodes: int, explore: bool = False, seed: int | None = None):
        return evaluate_agent(self.agent, self.cfg, self.obs_spec, self.act_spec, episodes,
                              explore, seed)

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> "ActingRun":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load_to_act(run_dir: Path | str, device: str = "auto") -> ActingRun:
    """The newest checkpoint of `run_dir` (and its replay's newest steps) on `device` (auto:
    the run's own where this machine has it). A corrupt newest checkpoint is skipped for the
    one before, not renamed: the run may be training."""
    run_dir = Path(run_dir).expanduser()
    cfg, loaded = resumed_config(make_config("default", run={"steps": 0, "device": device}),
                                 run_dir, set_aside=False)
    return ActingRun(cfg, run_dir, loaded)
