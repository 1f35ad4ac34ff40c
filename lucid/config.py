"""Typed configuration (OmegaConf structured dataclasses), model sizes and presets.

The defaults are the 2023 paper's settings (arXiv 2301.04104v1). The suite presets take the
paper's sizes and train ratios. The CPU presets shrink what a CPU can afford (model size,
batch, train ratio) and, as docs/presets.md states, also raise the learning rates and add the
Nature recipe's replay value loss; every change is a config key, so the paper's settings stay
one override away. Override any key on the command line as `section.key=value`, e.g.
`train.train_ratio=512 model.size=S`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError


class ConfigError(ValueError):
    """A configuration key or value that cannot be used; the message names it and the fix."""


# size: (GRU units, dense units, dense layers, CNN multiplier, latent groups, latent classes)
SIZES: dict[str, tuple[int, int, int, int, int, int]] = {
    "nano": (16, 16, 1, 2, 4, 4),
    "micro": (32, 32, 1, 4, 8, 8),
    "mini": (64, 64, 1, 8, 16, 16),
    "XXS": (128, 128, 1, 16, 32, 32),
    "XS": (256, 256, 1, 24, 32, 32),
    "S": (512, 512, 2, 32, 32, 32),
    "M": (1024, 640, 3, 48, 32, 32),
    "L": (2048, 768, 4, 64, 32, 32),
    "XL": (4096, 1024, 5, 96, 32, 32),
}

# The Nature (2025) recipe's sizes (`model.recipe=nature`), the authors' size1m ... size400m:
# (deter, hidden, latent classes, CNN depth, units); 32 latents, 8 GRU blocks at every size.
NATURE_SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "1m": (512, 64, 4, 4, 64),
    "12m": (2048, 256, 16, 16, 256),
    "25m": (3072, 384, 24, 24, 384),
    "50m": (4096, 512, 32, 32, 512),
    "100m": (6144, 768, 48, 48, 768),
    "200m": (8192, 1024, 64, 64, 1024),
    "400m": (12288, 1536, 96, 96, 1536),
}
RECIPES = ("2023", "nature")


@dataclass
class EnvConfig:
    id: str = "CartPole-v1"
    num_envs: int = 1
    asynchronous: bool = False  # gymnasium AsyncVectorEnv (one process per env) instead of Sync
    max_episode_steps: Optional[int] = None  # replaces a registered id's limit; wraps others
    max_restarts: int = 10  # an env raising in step/reset is rebuilt up to this many times
    # Suite settings or a custom env's keyword arguments, e.g. env.kwargs.gray=true for Atari
    # (docs/environments.md lists them per suite).
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelConfig:
    size: str = "XS"
    recipe: str = "2023"  # "2023" (sizes nano ... XL) or "nature" (2025; sizes 1m ... 400m)
    agent: str = ""
    # Explicit overrides of the size table (None = take it from `size`).
    gru_units: Optional[int] = None
    dense_units: Optional[int] = None
    dense_layers: Optional[int] = None
    cnn_mult: Optional[int] = None
    latent_groups: Optional[int] = None
    latent_classes: Optional[int] = None
    vector_units: Optional[int] = None
    vector_layers: Optional[int] = None
    unimix: float = 0.01
    actor_unimix: Optional[float] = None
    num_bins: int = 255
    bins_low: float = -20.0
    bins_high: float = 20.0
    actor_min_std: float = 0.1
    actor_max_std: float = 1.0
    action_clip: float = 1.0

    def dims(self) -> dict[str, int]:
        if self.recipe == "nature":
            return self._nature_dims()
        if self.size in NATURE_SIZES:
            raise ConfigError(f"model.size={self.size!r} is a size of the Nature recipe: add "
                              f"model.recipe=nature (or --preset nature), or choose one of "
                              f"{', '.join(SIZES)}")
        if self.size not in SIZES:
            raise ConfigError(
                f"unknown model.size {self.size!r}; choose one of {', '.join(SIZES)}"
                + suggest(self.size, SIZES)
            )
        names = ("gru_units", "dense_units", "dense_layers", "cnn_mult", "latent_groups",
                 "latent_classes")
        out = dict(zip(names, SIZES[self.size]))
        for n in names:
            if getattr(self, n) is not None:
                out[n] = getattr(self, n)
        for n, of in (("vector_units", "dense_units"), ("vector_layers", "dense_layers")):
            out[n] = out[of] if getattr(self, n) is None else getattr(self, n)
        return out

    def _nature_dims(self) -> dict[str, int]:
        """The Nature sizes in the 2023 table's terms (notes and checks read these)."""
        if self.size not in NATURE_SIZES:
            hint = " (the 2023 recipe's size)" if self.size in SIZES else ""
            raise ConfigError(
                f"model.size={self.size!r}{hint} is not a size of model.recipe=nature; choose "
                f"one of {', '.join(NATURE_SIZES)}" + suggest(self.size, NATURE_SIZES))
        overrides = [n for n in ("gru_units", "dense_units", "dense_layers", "cnn_mult",
                                 "latent_groups", "latent_classes", "vector_units",
                                 "vector_layers") if getattr(self, n) is not None]
        if overrides:
            raise ConfigError(f"model.{overrides[0]} overrides a size of the 2023 recipe; "
                              f"model.recipe=nature takes its sizes whole "
                              f"({', '.join(NATURE_SIZES)})")
        deter, _, classes, depth, units = NATURE_SIZES[self.size]
        return {"gru_units": deter, "dense_units": units, "dense_layers": 3, "cnn_mult": depth,
                "latent_groups": 32, "latent_classes": classes, "vector_units": units,
                "vector_layers": 3}


@dataclass
class TrainConfig:
    batch_size: int = 16
    batch_length: int = 64
    horizon: int = 15
    gamma: float = 0.997
    lam: float = 0.95
    train_ratio: float = 512.0  # replayed steps (B*T per update) per environment step
    prefill: int = 1024  # random-action env steps before the first update (authors: B*T)
    prefill_random: bool = True
    replay_capacity: int = 1_000_000  # steps over all envs
    replay_max_gb: float = 0.0  # also cap the replay at this many GB (0 = no cap)
    replay_memmap: bool = False  # keep the replay in memory-mapped files (capacity > RAM)
    replay_chunk: int = 1024  # steps per env in each append-only replay file on disk
    max_nonfinite: int = 10  # stop (with a checkpoint) after this many bad updates in a row
    # world model
    decoder_scale: float = 1.0
    reward_scale: float = 1.0
    cont_scale: float = 1.0
    dyn_scale: float = 0.5
    rep_scale: float = 0.1
    free_nats: float = 1.0
    dyn_free_nats: Optional[float] = None  # the dynamics KL's own clip (None = free_nats)
    rep_free_nats: Optional[float] = None  # the representation KL's own clip (None = free_nats)
    model_lr: float = 1e-4
    model_eps: float = 1e-8
    model_clip: float = 1000.0
    # model.recipe=nature: its one optimizer takes model_lr and model_eps, clips each tensor's
    # gradient adaptively and warms its learning rate up from 0
    agc: float = 0.3  # clip |g| to agc · max(1e-3, |θ|) per parameter tensor
    lr_warmup: int = 1000  # updates over which the learning rate rises linearly from 0
    # actor and critic
    actor_lr: float = 3e-5
    actor_eps: float = 1e-5
    actor_clip: float = 100.0
    critic_lr: float = 3e-5
    critic_eps: float = 1e-5
    critic_clip: float = 100.0
    entropy: float = 3e-4
    slow_critic_fraction: float = 0.02
    slow_critic_reg: float = 1.0
    replay_value_scale: float = 0.0  # critic loss on replayed λ-returns (0: 2023; Nature: 0.3)
    replay_value_grad: bool = False  # it also trains the encoder and RSSM (Nature: true)
    replay_context: int = 0
    return_norm_decay: float = 0.99
    return_norm_low: float = 5.0  # percentile
    return_norm_high: float = 95.0  # percentile
    return_norm_min_scale: float = 1.0  # the paper: max(1, S); RLlib uses 1e-8
    # Box-only action spaces: "dynamics" backpropagates through the model (the 2023 paper);
    # "reinforce" uses REINFORCE for them too (the 2025 paper). Spaces with discrete actions,
    # mixed Dict/Tuple spaces included, always learn by REINFORCE.
    continuous_grad: str = "dynamics"
    actor_baseline_grad: bool = False
    # torch.compile the update's loops and nets (observe in chunks of 8 steps, the whole
    # REINFORCE imagination rollout, heads, encoder, decoder, actor and critic; the Nature
    # recipe: its filter step, rollout and nets, NatureAgent.compile); same maths,
    # compiled once per shape, which takes minutes (how long and where it pays:
    # docs/performance.md). null: chosen for the learner's device (below).
    compile: Optional[bool] = None
    # train.compile on a CPU: the compiled graphs' wrapper code in C++ instead of Python, so
    # each of their kernel calls costs less host time, at the price of a longer first
    # compile (docs/performance.md). GPUs keep the Python wrapper.
    cpp_wrapper: bool = True  # train.compile on CPU: graphs call their kernels from C++
    # Speed switches that keep the maths (docs/performance.md). precision "bf16": the update's
    # matmuls and convolutions run in bf16 under torch.autocast (GPU, or CPUs with bf16 units);
    # norms, GRU state, distributions, KL, two-hot losses, returns and all parameters and
    # optimizer state stay fp32. null: chosen for the learner's device (below): bf16 on CUDA
    # when the update is compiled and graphed and the GPU has bf16 (eager bf16 does not beat
    # eager fp32 there: docs/performance.md), else fp32.
    precision: Optional[str] = None  # "fp32", "bf16" (autocast of the forward passes), null
    # Sample the next batch on a background thread during the update (the authors' code
    # prefetches too): a batch may lack the last env step collected. null: on CUDA, where
    # sampling is a visible share of a fast update; off on a CPU, where it is a tiny share
    # of a slow one and the thread would take a core from the update.
    prefetch: Optional[bool] = None  # sample the next batch on a background thread
    onehot_gather: Optional[bool] = None  # imagined z as indices, no one-hot matmul (null: CPU)
    channels_last: bool = True  # image encoder convolutions on NHWC memory
    pad_bins: bool = True  # 255-bin heads give 256 logits, the extra one -inf (same distribution)
    # Accepted so that config.yaml files that name it still load: lucid no longer has C++
    # kernels of its own (their gain did not justify a compiler at run time); true warns.
    cpp_kernels: bool = False  # no effect (kept for old config.yaml files)
    # CUDA only: capture the whole update (losses, backward passes, optimizer steps) as one
    # CUDA graph and replay it per batch (lucid.graph.GraphedUpdate); one process, fixed B, T.
    # Settings left null are chosen for the learner's device (config.for_device): on CUDA
    # (one process) the update compiled, in bf16 and captured as one graph, over dense
    # one-hots, batches prefetched (the fastest GPU update: docs/performance.md);
    # data-parallel CUDA learners eager in fp32; on a CPU eager, fp32, no graph, gathered
    # one-hots, no prefetching.
    cuda_graph: Optional[bool] = None  # replay the update as one captured CUDA graph

    @property
    def window(self) -> int:
        """Replayed steps per window: `batch_length`, and the `replay_context` step before
        it whose stored latents start it."""
        return self.batch_length + self.replay_context


@dataclass
class RunConfig:
    steps: int = 100_000  # environment steps
    seed: int = 0
    tag: str = ""
    device: str = "auto"
    run_dir: Optional[str] = None
    log_every: float = 10.0  # seconds between metric rows
    eval_every: int = 0  # env steps between evaluations (0 = never)
    eval_episodes: int = 5
    checkpoint_minutes: float = 10.0
    checkpoint_every: int = 0  # also checkpoint every this many env steps (0 = by time only)
    keep_checkpoints: int = 3
    video_every: int = 0  # env steps between eval + dream videos in TensorBoard (0 = never)
    videos: bool = True  # `lucid train` ends with curves.png, videos and report.html
    threads: int = 0  # torch CPU threads (0 = half the cores, at least 1: room for the rest)
    tune_malloc: bool = True  # glibc serves every block from its heap, reused (lucid/system.py)
    progress: bool = True
    time_limit: float = 0.0  # minutes per session (resumes get their own); 0 = no limit
    target_return: Optional[float] = None  # stop once the mean of the last 10 returns reaches it
    # Scale-out (docs/scaling.md). Env runners: "local" steps env.num_envs envs in the learner
    # process; "ray" starts num_runners Ray actors stepping envs_per_runner envs each (env.num_envs
    # is then unused), with a CPU copy of the policy refreshed every weight_sync_every updates.
    # Each runner sends chunks of runner_chunk steps per env; it has at most one chunk in flight,
    # so runners wait for a learner that is behind the train ratio (which stays exact).
    runners: str = "local"
    num_runners: int = 2
    envs_per_runner: int = 1
    runner_chunk: int = 32  # env steps per env in each chunk a runner sends to the replay
    weight_sync_every: int = 1  # learner updates between policy weight pushes to a runner
    runner_cpus: float = 1.0  # Ray CPUs reserved per runner
    max_runner_restarts: int = 100  # dead runners replaced up to this many times, then stop
    ray_address: Optional[str] = None  # existing Ray cluster ("auto", "host:port"); None = local
    ray_num_cpus: int = 0  # CPUs of a local Ray instance (0 = num_runners * runner_cpus)
    # Data-parallel learners (`torchrun --nproc-per-node G -m lucid train ...`): train.batch_size
    # is per learner; every this many updates the ranks compare a parameter checksum (0 = never).
    dist_check_every: int = 100
    # Logging backends besides metrics.jsonl and episodes.jsonl (always written): "tensorboard",
    # "wandb", several as a comma string or a list ("tensorboard,wandb"), or "none".
    logger: Any = "tensorboard"
    wandb_project: str = "lucid"  # W&B project (run.logger includes wandb)
    # W&B mode: "offline" (files in RUN_DIR/wandb, no network; `wandb sync` uploads them later),
    # "online" (needs `wandb login`) or "disabled". The WANDB_MODE environment variable wins.
    wandb_mode: str = "offline"
    histogram_every: int = 10  # metric rows between histograms of episode returns (0 = never)


# run.* keys a resume may change (`lucid train --resume DIR run.time_limit=30`): how far and
# how a session runs, not what the checkpoint and replay hold
RESUME_SETTABLE = ("run.steps", "run.device", "run.log_every", "run.eval_every",
                   "run.eval_episodes", "run.checkpoint_minutes", "run.checkpoint_every",
                   "run.keep_checkpoints", "run.video_every", "run.videos", "run.threads",
                   "run.tune_malloc", "run.progress", "run.time_limit", "run.target_return",
                   "run.histogram_every", "run.logger", "run.wandb_mode", "run.ray_address",
                   "run.dist_check_every")


@dataclass
class ExploreConfig:
    # Curiosity (docs/exploration.md). "p2e" (Plan2Explore): an ensemble's disagreement about
    # the next latent is an intrinsic reward, which an exploration actor-critic maximizes in
    # imagination and which acts in the envs; the task actor-critic learns from the same
    # world model on the env's reward and is the one evaluated. "none": the paper's agent.
    method: str = "none"  # "none" or "p2e" (Plan2Explore)
    # Env steps (prefill included) during which the exploration policy acts on the intrinsic
    # reward alone: the reward-free phase. Rewards are still recorded, so the task policy
    # learns offline meanwhile (the periodic evaluations are zero-shot).
    reward_free_steps: int = 0  # length of the reward-free phase (0: none)
    # Who acts after the reward-free phase: "explore" (the exploration policy, on
    # extr_scale·extrinsic + intr_scale·intrinsic, the authors' setting) or "task" (the task
    # policy: few-shot fine-tuning).
    then: str = "explore"  # "explore" or "task"
    extr_scale: float = 1.0  # weight of the env's reward in the exploration actor's advantage
    intr_scale: float = 0.1  # weight of the disagreement (each return normalized on its own)
    # Divide the disagreement by a running mean of itself, so that it is about 1 per step
    # whatever the latent's size; false: the raw variance, which DreamerV3's return
    # normalizer (floor 1) leaves too small to steer the explorer.
    intr_norm: bool = True  # divide the disagreement by its running mean
    # That mean's decay per update; 0: this batch's own mean. The disagreement falls tenfold
    # as the ensemble learns a region and jumps when the explorer reaches a new one; a slow
    # mean (0.99) lags both, shrinking the reward under the entropy bonus, then inflating it
    # into advantages that collapse the explorer onto one path (docs/exploration.md).
    intr_norm_decay: float = 0.0  # decay of the disagreement's running mean (0: the batch's)
    # What the ensemble predicts of the next step: "embed" (the encoder's embedding of the
    # next observation, as the Plan2Explore paper) or "latent" (the next posterior z, the
    # authors' 2023 DreamerV3 code). A small model's posterior can stay near uniform (the
    # history in h carries the state), leaving z a coin toss no member can learn.
    target: str = "embed"  # what the ensemble predicts: "embed" or "latent"
    # What the ensemble reads of a state, besides the action: "deter" (h alone) or "feat"
    # ([h, z], the authors' code). A near-uniform posterior's z is noise, whose fresh draws
    # in imagination the members disagree about wherever the state is (docs/exploration.md).
    inputs: str = "deter"  # the ensemble's input: "deter" ([h, a]) or "feat" ([h, z, a])
    # The exploration actor's entropy scale; null takes train.entropy, the task actor's, as
    # the authors' code. Its intrinsic reward is dense and normalized, so its advantages stay
    # near 1 and train.entropy's 3e-4 let it settle on one path; docs/exploration.md measures.
    entropy: Optional[float] = 1e-2  # the exploration actor's entropy scale (null: train.entropy)
    members: int = 8  # predictors in the ensemble
    layers: int = 5  # hidden layers of each member
    units: Optional[int] = None  # their width (null: the model size's dense units; authors 1024)
    lr: float = 1e-4  # the ensemble's Adam
    eps: float = 1e-5  # its epsilon
    clip: float = 100.0  # its gradient-norm clip


EXPLORE_METHODS = ("none", "p2e")


@dataclass
class Config:
    preset: str = "default"
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)
    explore: ExploreConfig = field(default_factory=ExploreConfig)


# The config's sections (env, model, train, run): a `section.key=value` names one of them.
SECTIONS = tuple(f.name for f in dataclasses.fields(Config)
                 if dataclasses.is_dataclass(f.default_factory))


# --------------------------------------------------------------------------- presets

# The CPU presets' shared recipe (they differ only in how many env steps a run takes).
_CPU_RECIPE: dict[str, Any] = {
    "env": {"num_envs": 1},
    "model": {"size": "mini"},
    "train": {"batch_size": 8, "batch_length": 32, "train_ratio": 32, "prefill": 1000,
              "model_lr": 3e-4, "actor_lr": 3e-4, "critic_lr": 3e-4,
              "replay_value_scale": 0.3},
}

# The Nature recipe's training settings (the authors' current configs.yaml `agent`).
_NATURE_TRAIN: dict[str, Any] = {"model_lr": 4e-5, "model_eps": 1e-20, "dyn_scale": 1.0,
                                 "replay_value_scale": 0.3, "replay_value_grad": True,
                                 "replay_context": 1, "gamma": 1 - 1 / 333}

# suite: (size, envs, train ratio, env steps, env.kwargs)
_NATURE_SUITES: dict[str, tuple] = {
    "atari": ("200m", 16, 32, 50_000_000, {"size": 96, "gray": True, "noops": 30}),
    "atari100k": ("200m", 1, 256, 100_000, {}),
    "crafter": ("200m", 1, 512, 1_000_000, {}),
    "dmc-proprio": ("1m", 16, 1024, 500_000, {"repeat": 1}),
    "dmc-vision": ("200m", 16, 256, 1_000_000, {"repeat": 1}),
}


def _nature_suite(size: str, envs: int, ratio: float, steps: int, env_kwargs: dict) -> dict:
    return {"env": {"num_envs": envs, "kwargs": env_kwargs},
            "model": {"recipe": "nature", "size": size},
            "train": {**_NATURE_TRAIN, "train_ratio": ratio, "replay_capacity": 5_000_000,
                      "prefill_random": False},
            "run": {"steps": steps}}


PRESETS: dict[str, dict[str, Any]] = {
    # The paper's settings, as published: "default" is XS (ModelConfig's default size, as
    # RLlib's); the suites take the sizes, train ratios and env counts of the authors' 2023
    # configs.yaml (Atari: the XL defaults, 8 envs; DMC: S, the default 4 envs; Crafter and
    # Atari100k: 1 env). Each runs the budget of the paper's results, which counts frames:
    # run.steps counts env (agent) steps, so the budget is divided by the action repeat:
    # Atari 200M frames (50M steps of 4), Atari100k 400k frames (100k steps), DMC proprio
    # 500k and vision 1M frames (250k and 500k steps of 2), Crafter 1M (no repeat).
    "default": {},
    "paper-cartpole": {"model": {"size": "XS"}, "train": {"train_ratio": 1024}},
    "atari": {"env": {"num_envs": 8}, "model": {"size": "XL"}, "train": {"train_ratio": 64},
              "run": {"steps": 50_000_000}},
    "atari100k": {"model": {"size": "S"}, "train": {"train_ratio": 1024},
                  "run": {"steps": 100_000}},
    # DMC proprio: the vector MLPs of the authors' code, which made the published curves
    "dmc-proprio": {"env": {"num_envs": 4},
                    "model": {"size": "S", "vector_units": 1024, "vector_layers": 5},
                    "train": {"train_ratio": 512}, "run": {"steps": 250_000}},
    "dmc-vision": {"env": {"num_envs": 4}, "model": {"size": "S"},
                   "train": {"train_ratio": 512}, "run": {"steps": 500_000}},
    "crafter": {"model": {"size": "XL"}, "train": {"train_ratio": 512},
                "run": {"steps": 1_000_000}},
    # The Nature (2025) recipe as the authors' current code sets it (configs.yaml `agent`):
    # one LaProp optimizer (lr 4e-5, eps 1e-20), dyn loss 1.0, the replay value loss (0.3)
    # with its gradient into the world model, γ = 1 - 1/333 (their `horizon`).
    "nature": {"model": {"recipe": "nature", "size": "12m"}, "train": _NATURE_TRAIN},
    # The Nature recipe's suites as the authors' current configs.yaml sets them (`atari`,
    # `atari100k`, `crafter`, `dmc_proprio`, `dmc_vision`): its default size (200m) except
    # DMC proprio's 1m, 16 envs except Atari100k's and Crafter's 1, its train ratios, a
    # replay of 5e6 steps, Atari at 96x96 grayscale with 30 no-ops and DMC without action
    # repeat; the policy acts from the first step (no random prefill) and updates start
    # once the replay holds B*T steps. Each runs the budget of the paper's results.
    **{f"nature-{suite}": _nature_suite(*spec) for suite, spec in _NATURE_SUITES.items()},
    # The Nature recipe on a laptop CPU: size 1m with cpu-control's batches and train ratio,
    # its one learning rate 2.5x the authors' (1e-4) and warmed up over 100 updates.
    "nature-cpu": {"env": {"num_envs": 1}, "model": {"recipe": "nature", "size": "1m"},
                   "train": {**_NATURE_TRAIN, "batch_size": 8, "batch_length": 32,
                             "train_ratio": 32, "prefill": 1000, "model_lr": 1e-4,
                             "lr_warmup": 100},
                   "run": {"steps": 30_000}},
    # Measured to learn small control tasks fastest on a 2-core CPU (see docs/presets.md):
    # the paper's algorithm with a small model, shorter windows, a lower train ratio,
    # 3x (world model) / 10x (actor, critic) the paper's learning rates and the Nature
    # recipe's replay value loss (weight 0.3).
    "cpu-control": {**_CPU_RECIPE, "run": {"steps": 30_000}},
    # The same recipe for small pixel tasks (64x64 images, e.g. minigrid:Empty-5x5) on a CPU.
    "cpu-pixels": {**_CPU_RECIPE, "run": {"steps": 100_000}},
}


LOGGERS = ("tensorboard", "wandb")


def logger_backends(value: Any) -> list[str]:
    """`run.logger` as a list of backend names: "tensorboard,wandb", ["wandb"], "none" -> []."""
    if value is None or isinstance(value, str):
        items = (value or "").split(",")
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise ConfigError(f"run.logger must be a name, a comma string or a list, got {value!r}")
    names = [str(x).strip().lower() for x in items]
    names = [n for n in names if n and n not in ("none", "jsonl")]  # JSONL is always written
    for n in names:
        if n not in LOGGERS:
            raise ConfigError(f"unknown run.logger backend {n!r}; choose from "
                              f"{', '.join(LOGGERS)} or none (several: tensorboard,wandb)"
                              + suggest(n, LOGGERS))
    return list(dict.fromkeys(names))


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # e.g. sys.modules[module] is None
        return False


def suggest(word: str, options) -> str:
    options = list(options)
    same = [o for o in options if str(o).lower() == str(word).lower()]  # xs -> XS
    close = same or difflib.get_close_matches(str(word), options, n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _all_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    keys = []
    for k, v in cfg.items():
        full = f"{prefix}{k}"
        keys.append(full)
        if isinstance(v, DictConfig):
            keys += _all_keys(v, full + ".")
    return keys


def make_config(preset: str = "default", overrides: list[str] | dict | None = None,
                **sections: Any) -> Config:
    """Build a validated config: dataclass defaults <- preset <- sections <- dotlist overrides."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}"
                          + suggest(preset, PRESETS))
    base = OmegaConf.structured(Config)
    layers = [PRESETS[preset], {"preset": preset}, sections]
    if isinstance(overrides, dict):
        layers.append(overrides)
    elif overrides:
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"override {item!r} is not of the form section.key=value "
                                  f"(e.g. train.train_ratio=512)")
            key = item.split("=", 1)[0].strip()
            if not key:
                raise ConfigError(f"override {item!r} names no key; write section.key=value "
                                  f"(e.g. train.train_ratio=512)")
            if key == "preset":  # it would only relabel the config, none of its values
                raise ConfigError(f"override {item!r} would rename the preset, not apply it; "
                                  f"choose it with --preset {item.split('=', 1)[1].strip()} "
                                  f"(Python: preset=...)")
            if key in SECTIONS:  # train=5: a whole section, which takes no value
                raise ConfigError(f"override {item!r} sets the whole {key} section; set one "
                                  f"of its keys, {key}.KEY=value (`lucid config` lists them)")
        try:
            layers.append(OmegaConf.from_dotlist(list(overrides)))
        except Exception as exc:  # malformed dotlist
            raise ConfigError(f"cannot parse overrides {overrides}: {exc}") from exc
        glued = _glued_keys(OmegaConf.to_container(layers[-1]))
        if glued:  # YAML reads {size:7} as the key "size:7" without a value
            key, value = glued[0].split(":", 1)
            raise ConfigError(f"override {', '.join(overrides)} gives the key {glued[0]!r} "
                              f"with no value: YAML needs a space after the colon, e.g. "
                              f"{{{key}: {value}}}")
    cfg = base
    for layer in layers:
        try:
            cfg = OmegaConf.merge(cfg, layer)
        except (ConfigKeyError, ConfigAttributeError) as exc:
            key = getattr(exc, "full_key", None) or str(exc)
            raise ConfigError(f"unknown config key {key!r}"
                              + suggest(key, _all_keys(base))
                              + "; list them all with `lucid config`") from None
        except ValidationError as exc:
            if not exc.full_key:  # a whole section given a value (Dreamer(train=[...]), a dict)
                raise ConfigError(f"bad config value: {str(exc).splitlines()[0]}; give each "
                                  f"section a mapping of its keys") from None
            raise ConfigError(f"bad value for config key {exc.full_key!r}: "
                              f"{_first_line(exc)}") from None
    obj: Config = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    validate(obj)
    return obj


def _glued_keys(tree: Any) -> list[str]:
    """Mapping keys `k:v` whose value is None, anywhere in `tree`."""
    if not isinstance(tree, dict):
        return [k for v in tree for k in _glued_keys(v)] if isinstance(tree, list) else []
    return [k for k, v in tree.items() if isinstance(k, str) and ":" in k and v is None] + [
        k for v in tree.values() for k in _glued_keys(v)]


def _explore_checks(cfg: Config) -> list[tuple[bool, str]]:
    e = cfg.explore
    p2e = e.method == "p2e"
    return [
        (e.method in EXPLORE_METHODS, f"explore.method must be one of "
         f"{', '.join(EXPLORE_METHODS)}, not {e.method!r}" + suggest(str(e.method),
                                                                    EXPLORE_METHODS)),
        (e.then in ("explore", "task"), f"explore.then must be 'explore' or 'task', not "
         f"{e.then!r}"),
        (e.inputs in ("feat", "deter"), f"explore.inputs must be 'feat' or 'deter', not "
         f"{e.inputs!r}"),
        (e.target in ("embed", "latent"), f"explore.target must be 'embed' or 'latent', not "
         f"{e.target!r}"),
        (e.reward_free_steps >= 0 and e.extr_scale >= 0 and e.intr_scale >= 0,
         "explore.reward_free_steps, explore.extr_scale and explore.intr_scale must be >= 0"),
        (e.members >= 2 and e.layers >= 0 and (e.units is None or e.units >= 1),
         "explore.members must be >= 2, explore.layers >= 0 and explore.units >= 1 (or null)"),
        (e.entropy is None or e.entropy >= 0, "explore.entropy must be >= 0 (or null)"),
        (0 <= e.intr_norm_decay < 1, f"explore.intr_norm_decay must be in [0, 1), not "
         f"{e.intr_norm_decay}"),
        (e.lr >= 0 and e.eps >= 0 and e.clip > 0,
         "explore.lr and explore.eps must be >= 0 and explore.clip > 0"),
        (not p2e or e.intr_scale > 0, "explore.method=p2e explores on the disagreement: "
         "explore.intr_scale must be > 0"),
        (not p2e or e.reward_free_steps > 0 or e.then == "explore",
         "explore.method=p2e with explore.then=task and explore.reward_free_steps=0 never "
         "lets the exploration policy act: set explore.reward_free_steps, or "
         "explore.then=explore"),
        (not p2e or cfg.model.recipe == "2023", "explore.method=p2e builds on the 2023 "
         "recipe's agent for now: leave model.recipe=2023"),
        (not p2e or cfg.run.runners == "local", "explore.method=p2e chooses on the learner "
         "which policy acts, so it steps local envs (run.runners=local) for now"),
    ]


def validate(cfg: Config) -> None:
    """Refuse impossible combinations before anything runs."""
    if cfg.model.recipe not in RECIPES:
        raise ConfigError(f"model.recipe must be one of {', '.join(RECIPES)}, not "
                          f"{cfg.model.recipe!r}" + suggest(str(cfg.model.recipe), RECIPES))
    cfg.model.dims()  # checks the size name
    loggers = logger_backends(cfg.run.logger)
    t = cfg.train
    nonfinite = _nonfinite(cfg)
    checks = [
        # first: NaN fails every comparison below, inf passes some
        (not nonfinite, f"{' and '.join(nonfinite)} must be "
         f"{'a finite number' if len(nonfinite) == 1 else 'finite numbers'}"),
        (cfg.env.num_envs >= 1, "env.num_envs must be >= 1"),
        (t.batch_size >= 1 and t.batch_length >= 2, "train.batch_size >= 1 and train.batch_length >= 2"),
        (t.horizon >= 1, "train.horizon must be >= 1"),
        (0 < t.gamma <= 1 and 0 <= t.lam <= 1, "train.gamma in (0, 1] and train.lam in [0, 1]"),
        (t.train_ratio > 0, "train.train_ratio must be > 0"),
        (t.replay_value_scale >= 0, "train.replay_value_scale must be >= 0"),
        (not t.replay_value_grad or t.replay_value_scale > 0,
         "train.replay_value_grad=true trains the world model through the replay value loss, "
         "which train.replay_value_scale=0 turns off: set train.replay_value_scale "
         "(0.3 in the Nature paper) or train.replay_value_grad=false"),
        (t.replay_context in (0, 1), "train.replay_context must be 0 (windows start from "
         "the zero state) or 1 (from the stored state of the step before)"),
        (not t.replay_context or cfg.model.recipe == "nature",
         "train.replay_context=1 stores the Nature recipe's latents: the 2023 recipe starts "
         "each window from its learned initial state (set model.recipe=nature, or "
         "train.replay_context=0)"),
        (t.replay_capacity >= t.window * cfg.env.num_envs,
         "train.replay_capacity must hold at least one window (train.batch_length + "
         "train.replay_context steps) per env"),
        (t.continuous_grad in ("dynamics", "reinforce"),
         "train.continuous_grad must be 'dynamics' or 'reinforce'"),
        (t.precision in (None, "fp32", "bf16"),
         "train.precision must be 'fp32' or 'bf16' (or null: chosen for the device)"),
        (not t.cuda_graph or cfg.run.device != "cpu",
         "train.cuda_graph=true needs a CUDA device: use --device cuda, or train.cuda_graph=false"),
        (cfg.run.device in ("auto", "cpu", "cuda") or cfg.run.device.startswith("cuda:"),
         "run.device must be auto, cpu or cuda[:N]"),
        (cfg.run.steps >= 0, "run.steps must be >= 0"),
        (min(t.model_lr, t.actor_lr, t.critic_lr) >= 0, "learning rates must be >= 0"),
        (t.agc >= 0 and t.lr_warmup >= 0, "train.agc and train.lr_warmup must be >= 0"),
        (min(t.model_clip, t.actor_clip, t.critic_clip) > 0,  # a clip <= 0 scales by <= 0
         "train.model_clip, train.actor_clip and train.critic_clip must be > 0 (inf: no "
         "clipping)"),
        (min(t.model_eps, t.actor_eps, t.critic_eps) >= 0,
         "train.model_eps, train.actor_eps and train.critic_eps must be >= 0"),
        (0 <= t.return_norm_low < t.return_norm_high <= 100,
         "train.return_norm_low and train.return_norm_high are percentiles: 0 <= low < high "
         "<= 100 (the paper: 5 and 95)"),
        (0 <= t.return_norm_decay <= 1 and 0 <= t.slow_critic_fraction <= 1,
         "train.return_norm_decay and train.slow_critic_fraction must be in [0, 1]"),
        (t.return_norm_min_scale > 0,
         "train.return_norm_min_scale must be > 0 (the paper: 1, RLlib: 1e-8); at 0 returns "
         "that do not vary divide by 0"),
        (min(t.decoder_scale, t.reward_scale, t.cont_scale, t.dyn_scale, t.rep_scale,
             t.entropy, t.slow_critic_reg) >= 0,
         "loss weights must be >= 0: train.decoder_scale, train.reward_scale, "
         "train.cont_scale, train.dyn_scale, train.rep_scale, train.entropy, "
         "train.slow_critic_reg"),
        # numpy's seeds are < 2**32; data-parallel ranks add 7919 each
        (0 <= cfg.run.seed < 2**31, "run.seed must be in [0, 2**31)"),
        (0 <= cfg.model.unimix < 1 and 0 <= (cfg.model.actor_unimix or 0) < 1,
         "model.unimix and model.actor_unimix must be in [0, 1)"),
        (min(t.free_nats, t.dyn_free_nats or 0, t.rep_free_nats or 0) >= 0,
         "train.free_nats, train.dyn_free_nats and train.rep_free_nats must be >= 0"),
        (t.prefill >= 0 and t.replay_max_gb >= 0, "train.prefill and train.replay_max_gb >= 0"),
        (t.replay_chunk >= 1 and t.max_nonfinite >= 1,
         "train.replay_chunk and train.max_nonfinite must be >= 1"),
        (cfg.run.keep_checkpoints >= 1, "run.keep_checkpoints must be >= 1"),
        (cfg.env.max_restarts >= 0, "env.max_restarts must be >= 0"),
        (cfg.run.runners in ("local", "ray"), "run.runners must be 'local' or 'ray'"),
        *_explore_checks(cfg),
        (min(cfg.run.num_runners, cfg.run.envs_per_runner, cfg.run.runner_chunk,
             cfg.run.weight_sync_every) >= 1,
         "run.num_runners, run.envs_per_runner, run.runner_chunk and run.weight_sync_every "
         "must be >= 1"),
        (cfg.run.runners == "local" or t.replay_capacity >= t.batch_length * cfg.run.num_runners
         * cfg.run.envs_per_runner, "train.replay_capacity must hold at least one batch_length "
         "window per runner env"),
        (0 <= cfg.run.runner_cpus < math.inf and cfg.run.ray_num_cpus >= 0,  # Ray's, at the
         "run.runner_cpus and run.ray_num_cpus must be >= 0"),  # first step otherwise
        (cfg.run.dist_check_every >= 0 and cfg.run.max_runner_restarts >= 0,
         "run.dist_check_every and run.max_runner_restarts must be >= 0"),
        ("wandb" not in loggers or _installed("wandb"),
         "run.logger includes wandb, but the wandb package is not installed: "
         "pip install 'lucid-rl[wandb]'"),
        (cfg.run.wandb_mode in ("offline", "online", "disabled"),
         "run.wandb_mode must be offline, online or disabled"),
        (cfg.run.histogram_every >= 0, "run.histogram_every must be >= 0"),
        (min(cfg.run.eval_every, cfg.run.video_every, cfg.run.checkpoint_every) >= 0,
         "run.eval_every, run.video_every and run.checkpoint_every must be >= 0 (0 = never)"),
        (min(cfg.run.time_limit, cfg.run.log_every) >= 0 and cfg.run.checkpoint_minutes > 0,
         "run.time_limit (0 = none) and run.log_every must be >= 0, "
         "run.checkpoint_minutes > 0"),
        (cfg.run.threads >= 0, "run.threads must be >= 0 (0 = half the cores, at least 1)"),
        (cfg.run.eval_episodes >= 1, "run.eval_episodes must be >= 1"),
        (cfg.env.max_episode_steps is None or cfg.env.max_episode_steps >= 1,
         "env.max_episode_steps must be >= 1 (or null for the env's own limit)"),
        (all(v >= 1 for v in cfg.model.dims().values()),
         f"model sizes must be >= 1, got {cfg.model.dims()}"),
        (cfg.model.num_bins >= 2 and cfg.model.bins_low < cfg.model.bins_high,
         "model.num_bins must be >= 2 and model.bins_low < model.bins_high"),
        (0 < cfg.model.actor_min_std <= cfg.model.actor_max_std,
         "model.actor_min_std must be in (0, model.actor_max_std]"),
        (cfg.model.action_clip >= 0, "model.action_clip must be >= 0 (0 = off)"),
        ("render_mode" not in cfg.env.kwargs,
         "env.kwargs.render_mode is lucid's to set (rgb_array in the env that records videos, "
         "none in training envs); remove it"),
        ("max_episode_steps" not in cfg.env.kwargs,
         "use env.max_episode_steps instead of env.kwargs.max_episode_steps"),
    ]
    for ok, msg in checks:
        if not ok:  # the rule, and the values of the keys it names
            values = flatten(as_dict(cfg))
            named = dict.fromkeys(k for k in re.findall(r"\b(?:env|model|train|run)\.[a-z_]+",
                                                        msg) if k in values)
            got = ", ".join(f"{k}={values[k]!r}" for k in named)
            raise ConfigError(f"invalid config: {msg}" + (f" (got {got})" if got else ""))


def _first_line(exc: ValidationError) -> str:
    """What OmegaConf refused, without its details (full_key:, reference_type=, ...)."""
    return (exc.msg or str(exc)).splitlines()[0]


def _nonfinite(cfg: Config) -> list[str]:
    """The train.* and model.* keys whose values are NaN or infinite (a weight, a rate, a
    bin: every update would be non-finite), but for a gradient clip of inf (no clipping)."""
    out = []
    for section in ("train", "model"):
        values = getattr(cfg, section)
        for f in dataclasses.fields(values):
            v = getattr(values, f.name)
            if isinstance(v, float) and not math.isfinite(v) \
                    and not (f.name.endswith("_clip") and v == math.inf):
                out.append(f"{section}.{f.name}")
    return out


def cuda_features() -> dict[str, bool]:
    """What the fastest CUDA update needs beyond the graph: bf16 arithmetic on the GPU (compute
    capability 8.0 or newer; assumed where CUDA is absent, as when a config is chosen for a GPU
    on another machine), and what torch.compile's GPU kernels need: triton, a GPU it supports
    (compute capability 7.0 or newer), and a C compiler with Python's headers (triton builds
    its kernel launcher with them on first use)."""
    import os
    import shutil
    import sysconfig
    from pathlib import Path
    import torch
    gpu = torch.cuda.is_available()
    try:
        bf16 = not gpu or torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # torch < 2.5 has no including_emulation, and no emulation
        bf16 = torch.cuda.is_bf16_supported()
    volta = not gpu or torch.cuda.get_device_capability() >= (7, 0)
    cc = next((shutil.which(c) for c in (os.environ.get("CC"), "cc", "gcc", "clang")
               if c and shutil.which(c)), None)
    headers = Path(sysconfig.get_paths()["include"], "Python.h").is_file()
    triton = importlib.util.find_spec("triton") is not None
    return {"bf16": bf16, "compile": bool(triton and volta and cc and headers)}


def for_device(cfg: Config, device_type: str, data_parallel: bool = False) -> Config:
    """`cfg` with the settings it leaves to the learner's device (null) chosen, the fastest
    measured per device (docs/performance.md); the maths is the same either way:
    - on CUDA, one process: the update captured as one CUDA graph over dense one-hot layers,
      compiled (where torch.compile can build GPU kernels) and in bf16 (where the GPU has
      it, and only compiled: eager bf16 does not beat eager fp32 there); each follows from
      the one before, so train.cuda_graph=false alone also gives eager fp32; batches
      prefetched;
    - data-parallel CUDA learners: no graph (it is for one process), eager, fp32, batches
      prefetched;
    - a CPU: no graph, eager, fp32, the one-hot layers gather, no prefetching;
    - the Nature recipe: no graph, so eager fp32 on CUDA too, until its graphed, compiled
      and bf16 update has been measured on a GPU (train.cuda_graph=true, train.compile=true
      and train.precision=bf16 select each).
    A copy when anything was chosen, so a run's config.yaml keeps its nulls for the next
    device."""
    t, cuda = cfg.train, device_type == "cuda"
    chosen: dict[str, Any] = {}
    if t.cuda_graph is None:
        chosen["cuda_graph"] = cuda and not data_parallel and cfg.model.recipe != "nature"
    if t.onehot_gather is None:
        chosen["onehot_gather"] = not cuda
    if t.prefetch is None:
        chosen["prefetch"] = cuda
    if t.compile is None or t.precision is None:
        graph = chosen.get("cuda_graph", t.cuda_graph)
        features = cuda_features() if cuda and graph else {"bf16": False, "compile": False}
        if t.compile is None:
            chosen["compile"] = graph and features["compile"]
        if t.precision is None:
            compiled = chosen.get("compile", t.compile)
            chosen["precision"] = "bf16" if compiled and features["bf16"] else "fp32"
    if not chosen:
        return cfg
    return dataclasses.replace(cfg, train=dataclasses.replace(t, **chosen))


def as_dict(cfg: Config) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg))


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}: config keys as the command line writes them."""
    out = {}
    for key, val in tree.items():
        if isinstance(val, dict):
            out.update(flatten(val, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = val
    return out


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def from_yaml(text: str, where: str = "config file") -> Config:
    """A Config from YAML text (a run's config.yaml): every key must be one this version of
    lucid knows; keys the text leaves out take their defaults."""
    try:
        loaded = OmegaConf.create(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML ({' '.join(str(exc).split())}); fix "
                          f"the line named, or restore it from the run's checkpoint "
                          f"(its 'config' entry)") from None
    if not isinstance(loaded, DictConfig) or not loaded:
        raise ConfigError(f"{where} is empty or not a mapping of config sections; restore it "
                          f"from the run's checkpoint (its 'config' entry)")
    base = OmegaConf.structured(Config)
    try:
        merged = OmegaConf.merge(base, loaded)
    except (ConfigKeyError, ConfigAttributeError) as exc:
        key = getattr(exc, "full_key", None) or str(exc).splitlines()[0]
        raise ConfigError(f"config file does not match this version of lucid: {where} has the "
                          f"key {key!r}, which this version does not know"
                          + suggest(key, _all_keys(base)) + "; remove it there, or use the "
                          "version that wrote it") from None
    except ValidationError as exc:  # a hand edit: train.batch_size: abc, or train: 5
        what = f"config key {exc.full_key!r}" if exc.full_key else "a config section"
        raise ConfigError(f"bad value for {what} in {where}: {_first_line(exc)}; fix that "
                          f"value there") from None
    obj: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    try:
        validate(obj)
    except ConfigError as exc:
        raise ConfigError(f"{exc}, in {where}: fix that value there") from None
    return obj
