"""What a user should know about a run that is no fault (`LucidNote`s: `note: ...` lines on
the command line, warnings in Python): settings that make no update or train slowly, the
device's faster settings, and what changed on resume."""

from __future__ import annotations

import torch

from .config import Config, make_config
from .device import compile_note, gpu_speed_note
from .warn import note

NO_EPISODE_STEPS = 10_000  # env steps without a finished episode before a run says so


def _no_update(cfg: Config, counters: dict, envs: int, ratio, local: bool) -> str | None:
    """Why a run of `cfg.run.steps` from `counters` would make no update, if it would not.
    `envs`: the env streams that env_steps counts (over all ranks)."""
    t, steps, done = cfg.train, cfg.run.steps, counters["env_steps"]
    if not done < steps:
        return None
    if steps <= t.prefill:
        kind = "random-action " if t.prefill_random else ""
        return (f"run.steps={steps} ends within the {t.prefill} {kind}steps of "
                f"train.prefill, so no update will be made; raise --steps or lower "
                f"train.prefill")
    window = t.window  # (a window lies within one env's steps)
    if steps < envs * window and local:
        return (f"run.steps={steps} gives each of the {envs} env(s) {steps // envs} steps, "
                f"fewer than one window of {window} (train.batch_length"
                f"{' + train.replay_context' if t.replay_context else ''}), so no update "
                f"will be made; raise --steps or lower train.batch_length")
    if ratio.due(steps) <= counters["updates"]:
        trains = steps - max(done, t.prefill)  # the steps that train
        return (f"{trains} env steps after train.prefill at train.train_ratio="
                f"{t.train_ratio:g} call for {trains * t.train_ratio:g} replayed steps, fewer "
                f"than the {ratio.replayed_per_update} of one update, so no update will be "
                f"made; raise --steps or train.train_ratio, or lower train.batch_size")
    return None


def before_run(cfg: Config, counters: dict, act_spec, device: torch.device, ratio,
               world: int = 1) -> None:
    """The notes before a run: `cfg` as the device chose its null settings, `world`
    data-parallel learners."""
    new, going = counters["env_steps"] == 0, counters["env_steps"] < cfg.run.steps
    envs = cfg.env.num_envs * world
    if why := _no_update(cfg, counters, envs, ratio, cfg.run.runners == "local"):
        note(why)
    if new and (gpu := gpu_speed_note(cfg, device, data_parallel=world > 1)):
        note(gpu)
    if going and (slow := compile_note(cfg)):
        note(slow)
    if (new and not act_spec.is_discrete and not act_spec.is_continuous
            and cfg.train.continuous_grad == "dynamics"):
        note("the action space has discrete and Box actions, so the actor learns all of them "
             "by REINFORCE, as the authors' current code does (train.continuous_grad=dynamics "
             "applies to Box-only spaces)")


def no_episode(env_steps: int) -> None:
    note(f"no episode has ended in {env_steps:,} env steps; if this env has no time limit, "
         f"give it one (env.max_episode_steps=N): returns, episodes.jsonl and evaluations "
         f"come from finished episodes")


def schedule_changed(was: dict, now: dict, updates: int) -> None:
    note(f"the train schedule changed on resume (train_ratio {was['train_ratio']:g} -> "
         f"{now['train_ratio']:g}, prefill {was['prefill']} -> {now['prefill']}, replayed "
         f"steps per update {was['replayed_per_update']} -> {now['replayed_per_update']}); "
         f"updates go on at the new ratio from {updates:,}")


def preset_note(cfg: Config, device: torch.device, spell: str) -> str | None:
    """For a preset the machine and the env picked (`device.preset_for`), not the user: what
    a CPU recipe changes, or that one of the paper's settings is slow on a CPU. `spell` writes
    a preset name as the user gives one (`--preset {}` for the CLI, `preset='{}'` in
    Python)."""
    t = cfg.train
    if cfg.preset.startswith("cpu-"):
        return (f"no preset given and no CUDA device: preset {cfg.preset}, lucid's recipe for "
                f"a CPU: the paper's algorithm with a {cfg.model.size} model, train ratio "
                f"{t.train_ratio:g}, learning rates {t.model_lr:g}/{t.actor_lr:g}/"
                f"{t.critic_lr:g} and the 2025 replay value loss (docs/presets.md); "
                f"{spell.format('default')} runs the 2023 paper's settings")
    if device.type != "cpu" or t.train_ratio != make_config(cfg.preset).train.train_ratio:
        return None  # (a GPU; or a train ratio of the user's: the choice is made)
    return (f"preset {cfg.preset} is the paper's setting (train ratio "
            f"{t.train_ratio:g}), slow on a CPU; for a small task try "
            f"{spell.format('cpu-control')} (vector observations) or "
            f"{spell.format('cpu-pixels')} (images)")
