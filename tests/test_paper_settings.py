"""The paper's hyperparameters, pinned. Every expected value below is written from the
project's reference notes on the 2023 paper and the authors' code
(../shared/reference/DREAMERV3.md: "The 2023 (v1) recipe" and its size table), not from
lucid/config.py, and is read back through `make_config(preset)`, so a changed default or
preset fails here with the reference's value beside it. The CPU presets may differ from the
paper only in the keys docs/presets.md lists for them."""

import pytest

from lucid.config import PRESETS, as_dict, flatten, make_config

# DREAMERV3.md, "The 2023 (v1) recipe"
PAPER = {
    "train.batch_size": 16, "train.batch_length": 64,  # B x T 16 x 64
    "train.horizon": 15,
    "train.gamma": 0.997, "train.lam": 0.95,
    "train.replay_capacity": 1_000_000,
    # world model: Adam lr 1e-4, eps 1e-8, clip grad global norm 1000
    "train.model_lr": 1e-4, "train.model_eps": 1e-8, "train.model_clip": 1000.0,
    # actor / critic: Adam lr 3e-5, eps 1e-5, clip 100, each its own optimizer
    "train.actor_lr": 3e-5, "train.actor_eps": 1e-5, "train.actor_clip": 100.0,
    "train.critic_lr": 3e-5, "train.critic_eps": 1e-5, "train.critic_clip": 100.0,
    # L_pred + 0.5 L_dyn + 0.1 L_rep, each KL clipped below at 1 nat
    "train.decoder_scale": 1.0, "train.reward_scale": 1.0, "train.cont_scale": 1.0,
    "train.dyn_scale": 0.5, "train.rep_scale": 0.1, "train.free_nats": 1.0,
    "train.entropy": 3e-4,
    # slow critic: EMA fraction 0.02 per update, regulariser weight 1
    "train.slow_critic_fraction": 0.02, "train.slow_critic_reg": 1.0,
    # S = EMA(0.99) of the 95th - 5th percentile; advantages divided by max(1, S)
    "train.return_norm_decay": 0.99, "train.return_norm_low": 5.0,
    "train.return_norm_high": 95.0, "train.return_norm_min_scale": 1.0,
    # continuous actions: backprop through the dynamics, Normal std in [0.1, 1]
    "train.continuous_grad": "dynamics",
    "model.actor_min_std": 0.1, "model.actor_max_std": 1.0,
    # the 2023 recipe has no replay value loss (the Nature recipe's 0.3)
    "train.replay_value_scale": 0.0,
    # 1% uniform mix in the latents (and the actor's categoricals)
    "model.unimix": 0.01,
    # two-hot: 255 bins uniform over [-20, 20] in symlog space
    "model.num_bins": 255, "model.bins_low": -20.0, "model.bins_high": 20.0,
}

# DREAMERV3.md's size table: GRU units, dense units, dense layers, CNN multiplier, latents
SIZES = {
    "nano": (16, 16, 1, 2, (4, 4)),
    "micro": (32, 32, 1, 4, (8, 8)),
    "mini": (64, 64, 1, 8, (16, 16)),
    "XXS": (128, 128, 1, 16, (32, 32)),
    "XS": (256, 256, 1, 24, (32, 32)),
    "S": (512, 512, 2, 32, (32, 32)),
    "M": (1024, 640, 3, 48, (32, 32)),
    "L": (2048, 768, 4, 64, (32, 32)),
    "XL": (4096, 1024, 5, 96, (32, 32)),
}

# Per preset: model size and train ratio (DREAMERV3.md's train ratios: Atari100k 1024,
# Atari 64, DMC 512, Crafter 512; docs/presets.md: the suites' sizes of the authors' 2023
# configs, paper-cartpole XS at 1024 as RLlib's CartPole example, default XS at 512)
SUITES = {
    "default": ("XS", 512),
    "paper-cartpole": ("XS", 1024),
    "atari": ("XL", 64),
    "atari100k": ("S", 1024),
    "dmc-proprio": ("S", 512),
    "dmc-vision": ("S", 512),
    "crafter": ("XL", 512),
}

# docs/presets.md, "`cpu-control`: what changes and why" and its table: a mini model,
# B x T 8 x 32, train ratio 32, learning rates 3e-4 for all three optimizers, the replay
# value loss at 0.3, 1,000 prefill steps, one env; and each preset's run.steps (free here)
CPU_CHANGES = {
    "model.size": "mini",
    "train.batch_size": 8, "train.batch_length": 32, "train.train_ratio": 32.0,
    "train.model_lr": 3e-4, "train.actor_lr": 3e-4, "train.critic_lr": 3e-4,
    "train.replay_value_scale": 0.3, "train.prefill": 1000, "env.num_envs": 1,
}
# keys that are not hyperparameters of the algorithm: which preset, how long a run lasts,
# and the number of envs stepped side by side (the suites' 1, 4 or 8)
FREE = {"preset", "run.steps", "env.num_envs"}


def values(preset: str) -> dict:
    return flatten(as_dict(make_config(preset)))


# The Nature recipe's preset: the authors' current configs.yaml (`agent`: opt lr 4e-5, eps
# 1e-20, agc 0.3, warmup 1000; loss_scales dyn 1.0, rep 0.1, repval 0.3 with repval_grad;
# horizon 333 = 1 / (1 - γ); imag_length 15, lam 0.95, actent 3e-4, slowvalue rate 0.02,
# slowreg 1.0, retnorm perc 5/95 rate 0.01 limit 1, unimix 0.01, free nats 1, policy std in
# [0.1, 1]; replay_context 1) at size12m; nothing else differs from the default
NATURE = {
    "model.recipe": "nature", "model.size": "12m",
    "train.model_lr": 4e-5, "train.model_eps": 1e-20, "train.agc": 0.3,
    "train.lr_warmup": 1000, "train.dyn_scale": 1.0, "train.rep_scale": 0.1,
    "train.replay_value_scale": 0.3, "train.replay_value_grad": True,
    "train.replay_context": 1, "train.gamma": 1 - 1 / 333, "train.horizon": 15, "train.lam": 0.95,
    "train.entropy": 3e-4, "train.slow_critic_fraction": 0.02, "train.slow_critic_reg": 1.0,
    "train.return_norm_decay": 0.99, "train.return_norm_low": 5.0,
    "train.return_norm_high": 95.0, "train.return_norm_min_scale": 1.0,
    "model.unimix": 0.01, "train.free_nats": 1.0,
    "model.actor_min_std": 0.1, "model.actor_max_std": 1.0,
}


def test_every_preset_is_pinned():
    assert set(PRESETS) == set(SUITES) | set(NATURE_SUITES) | {"cpu-control", "cpu-pixels",
                                                               "nature", "nature-cpu"}


def test_the_nature_preset_has_the_authors_current_settings():
    got, base = values("nature"), values("default")
    wrong = {k: (got[k], want) for k, want in NATURE.items() if got[k] != want}
    assert not wrong, f"(lucid, authors) {wrong}"
    extra = {k: (base[k], got[k]) for k in got
             if got[k] != base[k] and k not in NATURE and k not in FREE}
    assert not extra, f"nature changes {extra} (default, nature)"


@pytest.mark.parametrize("preset", list(SUITES))
def test_paper_presets_have_the_paper_hyperparameters(preset):
    got = values(preset)
    wrong = {k: (got[k], want) for k, want in PAPER.items() if got[k] != want}
    assert not wrong, f"{preset}: (lucid, paper) {wrong}"
    size, ratio = SUITES[preset]
    assert (got["model.size"], got["train.train_ratio"]) == (size, ratio)
    # nothing else of the model or its training differs from the default (the paper's)
    base = values("default")
    allowed = FREE | {"model.size", "train.train_ratio"}
    if preset == "dmc-proprio":  # the authors' 5 x 1024 vector MLPs (docs/presets.md)
        assert (got["model.vector_units"], got["model.vector_layers"]) == (1024, 5)
        allowed |= {"model.vector_units", "model.vector_layers"}
    extra = {k: (base[k], got[k]) for k in got if got[k] != base[k] and k not in allowed}
    assert not extra, f"{preset} changes {extra} (default, {preset})"


@pytest.mark.parametrize("size", list(SIZES))
def test_model_sizes_are_the_papers(size):
    gru, dense, layers, cnn, (groups, classes) = SIZES[size]
    dims = make_config("default", model={"size": size}).model.dims()
    assert dims == {"gru_units": gru, "dense_units": dense, "dense_layers": layers,
                    "cnn_mult": cnn, "latent_groups": groups, "latent_classes": classes,
                    "vector_units": dense, "vector_layers": layers}


@pytest.mark.parametrize("preset", ["cpu-control", "cpu-pixels"])
def test_cpu_presets_change_only_what_the_docs_say(preset):
    got, paper = values(preset), values("default")
    changed = {k: got[k] for k in got if got[k] != paper[k] and k not in FREE}
    assert changed == {k: v for k, v in CPU_CHANGES.items() if paper[k] != v and k not in FREE}
    assert all(got[k] == v for k, v in CPU_CHANGES.items())
    # and so they keep every other setting of the paper
    kept = {k: v for k, v in PAPER.items() if k not in CPU_CHANGES}
    assert {k: got[k] for k in kept} == kept


# docs/presets.md, "`nature-cpu`": the Nature preset at size 1m with cpu-control's batches,
# train ratio, prefill and one env, its one learning rate 1e-4 (2.5x) warmed up over 100
# updates
NATURE_CPU_CHANGES = {
    "model.size": "1m", "train.batch_size": 8, "train.batch_length": 32,
    "train.train_ratio": 32.0, "train.prefill": 1000, "train.model_lr": 1e-4,
    "train.lr_warmup": 100,
}


def test_the_nature_cpu_preset_changes_only_what_the_docs_say():
    got, nature = values("nature-cpu"), values("nature")
    changed = {k: got[k] for k in got if got[k] != nature[k] and k not in FREE}
    assert changed == NATURE_CPU_CHANGES


# The authors' current configs.yaml per suite (danijar/dreamerv3 main): the `defaults`
# block's agent (rssm deter 8192, hidden 1024, classes 64; depth 64; units 1024: size200m),
# run.envs 16, replay.size 5e6, no random agent (the policy acts from the start; training
# waits for B*T steps in the replay); then `atari: run.train_ratio 32` with env.atari size
# [96, 96], gray, noops 30; `atari100k: envs 1, train_ratio 256` (64x64 colour, no sticky
# actions, the needed actions, noops 30: lucid's atari100k suite as it is); `crafter: envs 1,
# train_ratio 512`; `dmc_proprio: size1m, train_ratio 1024`; `dmc_vision: train_ratio 256`;
# env.dmc.repeat 1. The budgets are the paper's (frames / repeat), as the 2023 suites'.
NATURE_SUITES = {
    "nature-atari": {"model.size": "200m", "env.num_envs": 16, "train.train_ratio": 32.0,
                     "env.kwargs": {"size": 96, "gray": True, "noops": 30}},
    "nature-atari100k": {"model.size": "200m", "env.num_envs": 1, "train.train_ratio": 256.0,
                         "env.kwargs": {}},
    "nature-crafter": {"model.size": "200m", "env.num_envs": 1, "train.train_ratio": 512.0,
                       "env.kwargs": {}},
    "nature-dmc-proprio": {"model.size": "1m", "env.num_envs": 16,
                           "train.train_ratio": 1024.0, "env.kwargs": {"repeat": 1}},
    "nature-dmc-vision": {"model.size": "200m", "env.num_envs": 16, "train.train_ratio": 256.0,
                          "env.kwargs": {"repeat": 1}},
}
NATURE_SUITE_COMMON = {"train.replay_capacity": 5_000_000, "train.prefill_random": False}


@pytest.mark.parametrize("preset", list(NATURE_SUITES))
def test_the_nature_suites_have_the_authors_settings(preset):
    got, nature = values(preset), values("nature")
    want = {**NATURE_SUITES[preset], **NATURE_SUITE_COMMON}
    kwargs = want.pop("env.kwargs")
    assert dict(make_config(preset).env.kwargs) == kwargs
    changed = {k: got[k] for k in got if got.get(k) != nature.get(k) and k not in FREE
               and not k.startswith("env.kwargs.")}
    assert changed == {k: v for k, v in want.items() if nature[k] != v and k not in FREE}
    assert all(got[k] == v for k, v in want.items())
