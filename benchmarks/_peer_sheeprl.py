"""ms per update in sheeprl, run inside benchmarks/.peers/sheeprl by peers.py: its `dreamer_v3`
(the 2023 recipe) at a 2023 size (XS, S, ...), its `dreamer_v3_5` (the Nature recipe) at a
Nature size (1m, 12m, ... 400m, as lucid names them).

Composes sheeprl's own config (`exp=dreamer_v3 algo=dreamer_v3_<size>`, or `exp=dreamer_v3_5
algo=dreamer_v3_5_<SIZE>` with the size upper-cased: 1m -> dreamer_v3_5_1M), builds the agent
and optimizers as its `main` does (Lightning Fabric on the CPU, fp32, uncompiled) and times one
gradient step of its training loop on a synthetic (T, B) batch shaped like its replay's samples
(one-hot float actions; float rewards and flags of shape (T, B, 1)):

- dreamer_v3: its `train` function (world model, actor, critic with their three optimizers),
  with the target-critic update its loop does before each call; float observations (images CHW
  in [0, 255]).
- dreamer_v3_5: its `train` function (the world model, actor and critic losses summed into one
  loss: world-model unroll, imagination of `algo.horizon` steps without gradient, REINFORCE
  actor, critic on imagined and replayed steps regularized to the slow critic; one backward
  and one step of its single LaProp optimizer), then the slow-critic update
  (`update_target_critic`) its loop does after each call (every step:
  `per_rank_target_network_update_freq` is 1). Images stay uint8 as its replay stores them.
  `algo.replay_context=0` (sequences start from the zero state, as lucid's benchmark runs
  its Nature agent with `train.replay_context=0`), so there are no stored latents in the
  batch and nothing to write back into a replay (`write_latent_states`, replay bookkeeping,
  is not an update's work and is not timed). No metric aggregator (as for dreamer_v3).

Prints one JSON line.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from _peer_common import report, time_updates, worker_args


def is_nature(size: str) -> bool:
    """lucid's Nature sizes: 1m, 12m, ... 400m."""
    return size[:-1].isdigit() and size[-1] in "mM"


def compose(a, exp: str, algo: str, extra: list[str]):
    import sheeprl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf
    from sheeprl.utils.utils import dotdict

    key = "rgb" if a.obs == "image" else "state"
    cnn = f"[{key}]" if a.obs == "image" else "[]"
    mlp = f"[{key}]" if a.obs == "vector" else "[]"
    overrides = [f"exp={exp}", f"algo={algo}", "env=gym",
                 f"algo.cnn_keys.encoder={cnn}", f"algo.cnn_keys.decoder={cnn}",
                 f"algo.mlp_keys.encoder={mlp}", f"algo.mlp_keys.decoder={mlp}",
                 f"algo.per_rank_batch_size={a.batch}",
                 f"algo.per_rank_sequence_length={a.length}",
                 "algo.horizon=15", "fabric.accelerator=cpu", "fabric.devices=1",
                 "metric.log_level=0", *extra]
    config_dir = str(Path(sheeprl.__file__).parent / "configs")
    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=overrides)
    return key, dotdict(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))


def setup(a, key: str):
    """Fabric (CPU, fp32), the observation space and 6 discrete actions."""
    from lightning.fabric import Fabric
    fabric = Fabric(accelerator="cpu", devices=1, precision="32-true")
    fabric.launch()
    obs_space = gym.spaces.Dict(
        {key: gym.spaces.Box(0, 255, (3, 64, 64), np.uint8) if a.obs == "image"
         else gym.spaces.Box(-1, 1, (4,), np.float32)})
    return fabric, obs_space, (6,)


def synthetic(a, key: str, image_dtype: torch.dtype) -> dict:
    T, B = a.length, a.batch
    g = torch.Generator().manual_seed(0)
    obs = (torch.randint(0, 256, (T, B, 3, 64, 64), generator=g).to(image_dtype)
           if a.obs == "image" else torch.randn(T, B, 4, generator=g))
    return {key: obs,
            "actions": torch.nn.functional.one_hot(torch.randint(0, 6, (T, B), generator=g),
                                                   6).float(),
            "rewards": torch.randn(T, B, 1, generator=g),
            "terminated": (torch.rand(T, B, 1, generator=g) < 0.01).float(),
            "truncated": torch.zeros(T, B, 1),
            "is_first": (torch.rand(T, B, 1, generator=g) < 0.01).float()}


def moments_of(cfg, Moments):
    m = cfg.algo.actor.moments
    return Moments(m.decay, m.max, m.percentile.low, m.percentile.high)


def run_2023(a) -> None:
    import hydra
    from sheeprl.algos.dreamer_v3.agent import build_agent
    from sheeprl.algos.dreamer_v3.dreamer_v3 import train
    from sheeprl.algos.dreamer_v3.utils import Moments

    key, cfg = compose(a, "dreamer_v3", f"dreamer_v3_{a.size}", [])
    fabric, obs_space, actions_dim = setup(a, key)
    torch.manual_seed(0)
    world_model, actor, critic, target_critic, _player = build_agent(
        fabric, actions_dim, False, cfg, obs_space)
    inst = lambda c, m: hydra.utils.instantiate(c, params=m.parameters(), _convert_="all")  # noqa: E731
    opts = fabric.setup_optimizers(inst(cfg.algo.world_model.optimizer, world_model),
                                   inst(cfg.algo.actor.optimizer, actor),
                                   inst(cfg.algo.critic.optimizer, critic))
    moments = moments_of(cfg, Moments)
    data = synthetic(a, key, torch.float32)
    tau = cfg.algo.critic.tau

    def update(batch):  # the target-critic update its loop does before each train() is timed
        for cp, tcp in zip(critic.module.parameters(), target_critic.parameters()):
            tcp.data.copy_(tau * cp.data + (1 - tau) * tcp.data)
        train(fabric, world_model, actor, critic, target_critic, *opts, batch, None, cfg,
              False, actions_dim, moments)

    # train() writes into is_first: each update gets a fresh copy (made untimed)
    times = time_updates(update, a, prepare=lambda: {k: v.clone() for k, v in data.items()})
    import importlib.metadata as md
    report("sheeprl", md.version("sheeprl"), a, times, horizon=cfg.algo.horizon,
           algo="dreamer_v3")


def run_nature(a) -> None:
    import hydra
    from sheeprl.algos.dreamer_v3_5.agent import build_agent
    from sheeprl.algos.dreamer_v3_5.dreamer_v3_5 import train, update_target_critic
    from sheeprl.algos.dreamer_v3_5.utils import Moments

    algo = f"dreamer_v3_5_{a.size.upper()}"
    key, cfg = compose(a, "dreamer_v3_5", algo,
                       ["algo.replay_context=0", "algo.compile.enabled=False"])
    fabric, obs_space, actions_dim = setup(a, key)
    torch.manual_seed(0)
    world_model, actor, critic, target_critic, _player = build_agent(
        fabric, actions_dim, False, cfg, obs_space)
    # one optimizer for the world model, the actor and the critic, as its main makes it
    optimizer = fabric.setup_optimizers(hydra.utils.instantiate(
        cfg.algo.optimizer,
        params=[*world_model.parameters(), *actor.parameters(), *critic.parameters()],
        _convert_="all"))
    moments = moments_of(cfg, Moments)
    data = synthetic(a, key, torch.uint8)
    every = cfg.algo.critic.per_rank_target_network_update_freq
    steps = 0

    def update(batch):  # one step of its loop: train(), then the slow-critic update
        nonlocal steps
        train(fabric, cfg, world_model, actor, critic, target_critic, optimizer, moments,
              batch, None, actions_dim)
        if steps % every == 0:
            update_target_critic(critic, target_critic, cfg.algo.critic.tau)
        steps += 1

    times = time_updates(update, a, prepare=lambda: {k: v.clone() for k, v in data.items()})
    import importlib.metadata as md
    params = sum(p.numel() for m in (world_model, actor, critic) for p in m.parameters())
    report("sheeprl", md.version("sheeprl"), a, times, horizon=cfg.algo.horizon, algo=algo,
           replay_context=cfg.algo.replay_context, params=params)


def main():
    a = worker_args()
    (run_nature if is_nature(a.size) else run_2023)(a)


if __name__ == "__main__":
    main()
