"""Continuing a run from its directory: the saved config (config.yaml, else the newest
checkpoint's), what a resume may change, and the checkpoint's state put back."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import checkpoint as ckpt
from .config import RESUME_SETTABLE, Config, ConfigError, as_dict, flatten, from_yaml
from .envs import env_label, instances
from .plugins import is_file_id
from .seeds import not_one_run
from .device import load_here
from .warn import note

# What a checkpoint fixes: the agent's shapes (model), and the replay's env streams (env,
# runners). A hand edit of these in config.yaml cannot be resumed. env.kwargs may change (a
# bad kwarg fixed): spaces that no longer fit are refused when the checkpoint is loaded.
FIXED_ON_RESUME = ("model", "env.id", "env.num_envs", "run.runners", "run.num_runners",
                   "run.envs_per_runner")


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
               if k.startswith(FIXED_ON_RESUME) and old.get(k) != new.get(k)]
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


def saved_config(run_dir: Path, set_aside: bool) -> tuple[Config, tuple[dict, Path] | None]:
    """The run's config.yaml, or where that file is missing or empty (a disk that filled
    up), the config stored in its newest checkpoint; and that checkpoint, when read."""
    path = run_dir / "config.yaml"
    text = path.read_text() if path.is_file() else ""
    if text.strip():
        return from_yaml(text, where=str(path)), None
    if run_dir.is_file():
        raise FileNotFoundError(f"{run_dir} is a file; give the run's directory "
                                f"(the one that holds config.yaml and checkpoints/)")
    if (several := not_one_run(run_dir)) is not None:
        raise FileNotFoundError(several)
    if not ckpt.list_checkpoints(run_dir):
        raise FileNotFoundError(
            f"{run_dir} is not a lucid run: it has no config.yaml and no checkpoints/"
            + ("" if run_dir.is_dir() else " (the directory does not exist)"))
    payload, found = loaded = ckpt.load_latest(run_dir, set_aside=set_aside)
    note(f"{path} is {'empty' if path.is_file() else 'missing'}; using the config stored in "
         f"{found}")
    return from_yaml(payload["config"], where=f"the config stored in {found}"), loaded


def resumed_config(cfg: Config, run_dir: Path, set_aside: bool, env: str | None = None,
                   settings: tuple[str, ...] = ()) -> tuple[Config, tuple[dict, Path]]:
    """The saved run's config, as it goes on with `cfg`'s run.steps (when not 0), run.device
    and values of the `settings` keys (of RESUME_SETTABLE), in `env` when given; and its
    newest checkpoint (payload, path). The checkpoint is read now, so that a config.yaml it
    does not fit is refused before anything is written. `set_aside`: a corrupt checkpoint is
    renamed (by one process only), else skipped for the previous one."""
    saved, loaded = saved_config(run_dir, set_aside)
    loaded = loaded or ckpt.load_latest(run_dir, set_aside=set_aside)
    payload, found = loaded
    check_resumable(from_yaml(payload["config"], where=f"the config stored in {found}"),
                    saved, run_dir / "config.yaml")
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
    return saved, loaded


def restore(run, payload: dict, path: Path, rank: int, learn: bool, reseed) -> str:
    """The checkpoint `payload` into `run` (a Trainer or a run loaded to act: its agent,
    counters, recent returns, episode metrics and replay, whose files on disk are read
    back); returns one line that says what was loaded. Data-parallel: only rank 0's random streams are saved; the other ranks draw new
    ones (`reseed(seed)`), not rank 0's nor their own start's again."""
    run.agent.load_state_dict(payload["agent"])
    run.counters.update(payload["counters"])
    run.recent = [float(r) for r in payload.get("recent_returns", [])]
    if "achievements" in payload:
        run.achievements.load_state_dict(payload["achievements"])
    restored = run.replay.restore(set_aside=learn)  # each rank's own directory
    if rank == 0:
        ckpt.set_rng_state(payload["rng"])
        run.replay.set_rng_state(payload["replay_rng"])
    else:
        seq = np.random.SeedSequence([run.cfg.run.seed, rank, run.counters["env_steps"]])
        reseed(int(seq.generate_state(1)[0]))
        run.replay.reseed(seq.spawn(1)[0])
    return (f"{'resumed from' if learn else 'loaded'} {path} at "
            f"{run.counters['env_steps']} env steps, "
            f"{run.counters['updates']} updates; replay holds {restored} steps per env")
