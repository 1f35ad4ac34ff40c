"""Where a run computes: `run.device` resolved on this machine, a saved run's device where
it is loaded, the settings that `for_device` leaves to the device, and the notes about speed
that a run on a device gets (the numbers behind them: docs/performance.md)."""

from __future__ import annotations

import dataclasses
import torch

from .config import Config, for_device
from .envs import default_preset, observation_space
from .specs import ObsSpec
from .warn import note


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
        note(f"the run was trained with run.device={saved}, which this machine lacks; "
             f"continuing on {resolve_device('auto')} (run.device=auto)")
        return "auto"


def preset_for(cfg: Config) -> str:
    """The preset of a run given none; `cfg` is its config under the `default` preset. The
    paper's suites keep their domain's preset everywhere. Any other env gets the paper's
    settings (`default`) on a CUDA device and, without one, lucid's CPU recipe: `cpu-pixels`
    when the env's observations hold images, else `cpu-control` (`notes.preset_note` says
    which and why)."""
    domain = default_preset(cfg.env.id)
    if domain != "default" or resolve_device(cfg.run.device).type == "cuda":
        return domain
    space = observation_space(cfg.env.id, cfg.env.max_episode_steps, **cfg.env.kwargs)
    return "cpu-pixels" if ObsSpec.from_space(space).images else "cpu-control"


def load_here(cfg: Config, device: str) -> None:
    """A saved run's config for this machine: `run.device` as `resumed_device` picks it, and
    the GPU-only `train.cuda_graph` off where that is no CUDA device (the same maths)."""
    cfg.run.device = resumed_device(cfg.run.device, device)
    if cfg.train.cuda_graph and resolve_device(cfg.run.device).type != "cuda":
        note("the run was trained with train.cuda_graph=true, which needs a CUDA device; "
             "continuing with train.cuda_graph=false (the same update, not captured)")
        cfg.train.cuda_graph = False


def chosen_for(cfg: Config, device: torch.device, learn: bool = True,
               data_parallel: bool = False) -> Config:
    """`cfg` with its null settings chosen for `device` (the agent's config; config.yaml
    keeps the nulls for the next device). An agent that only acts (evaluation, dreams) is
    not compiled unless asked: its first steps would wait for the compiler."""
    if not learn and cfg.train.compile is None:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, compile=False))
    return for_device(cfg, device.type, data_parallel=data_parallel)


def learn_as_chosen(agent, cfg: Config, chosen: Config) -> None:
    """An agent made to act (Dreamer before its first learn()), so not compiled, learns as the
    device chose for `cfg`: compiled, in the precision that goes with it."""
    t = agent.config.train
    if cfg.train.compile is None and chosen.train.compile and not t.compile:
        agent.config = dataclasses.replace(agent.config, train=dataclasses.replace(
            t, compile=True, precision=chosen.train.precision))
        agent.compile()


# The settings of the fastest update measured on a GPU (for_device's CUDA choices).
GPU_FAST = ("compile", "precision", "cuda_graph", "onehot_gather", "prefetch")


def gpu_speed_note(cfg: Config, device: torch.device, data_parallel: bool = False) -> str | None:
    """On a CUDA device, the settings of the fastest update measured on a GPU that `cfg` (as
    the agent has it: nulls chosen) was set away from: CUDA's defaults for one process, as
    `for_device` chooses them on this GPU. Data-parallel learners run eager (no graph there;
    the rest unmeasured), so nothing is said to them, nor to the Nature recipe, whose GPU
    update is unmeasured."""
    if device.type != "cuda" or data_parallel or cfg.model.recipe == "nature":
        return None
    t = cfg.train
    best = for_device(dataclasses.replace(
        cfg, train=dataclasses.replace(t, **dict.fromkeys(GPU_FAST))), "cuda").train
    missing = [f"train.{k}={str(getattr(best, k)).lower()}" for k in GPU_FAST
               if getattr(t, k) != getattr(best, k)]
    if not missing:
        return None
    return (f"on this GPU, {' '.join(missing)} (the default on CUDA) would make training "
            f"faster (docs/performance.md: GPU results)")


def compile_note(cfg: Config) -> str | None:
    """`train.compile` (CUDA's default): the first update waits for the compiler."""
    if not cfg.train.compile:
        return None
    return ("train.compile=true: the update is compiled before the first one (once per run "
            "and batch shape; how long: docs/performance.md); train.compile=false starts at "
            "once, with slower updates")
