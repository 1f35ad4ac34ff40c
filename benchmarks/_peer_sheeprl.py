"""ms per dreamer_v3 update in sheeprl (the 2023 recipe), run inside benchmarks/.peers/sheeprl
by peers.py.

Composes sheeprl's own config (`exp=dreamer_v3 algo=dreamer_v3_<size>`), builds the agent and
optimizers as its `main` does (Lightning Fabric on the CPU, fp32), and times its `train`
function (world model, actor, critic; the target-critic update its loop does before each
call is included) on a synthetic (T, B) batch shaped like its replay's samples (float
tensors; images CHW in [0, 255]; one-hot actions). Prints one JSON line.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from _peer_common import report, time_updates, worker_args


def main():
    a = worker_args()
    import hydra
    import sheeprl
    from hydra import compose, initialize_config_dir
    from lightning.fabric import Fabric
    from omegaconf import OmegaConf
    from sheeprl.algos.dreamer_v3.agent import build_agent
    from sheeprl.algos.dreamer_v3.dreamer_v3 import train
    from sheeprl.algos.dreamer_v3.utils import Moments
    from sheeprl.utils.utils import dotdict

    B, T = a.batch, a.length
    key = "rgb" if a.obs == "image" else "state"
    cnn = f"[{key}]" if a.obs == "image" else "[]"
    mlp = f"[{key}]" if a.obs == "vector" else "[]"
    overrides = ["exp=dreamer_v3", f"algo=dreamer_v3_{a.size}", "env=gym",
                 f"algo.cnn_keys.encoder={cnn}", f"algo.cnn_keys.decoder={cnn}",
                 f"algo.mlp_keys.encoder={mlp}", f"algo.mlp_keys.decoder={mlp}",
                 f"algo.per_rank_batch_size={B}", f"algo.per_rank_sequence_length={T}",
                 "algo.horizon=15", "fabric.accelerator=cpu", "fabric.devices=1",
                 "metric.log_level=0"]
    config_dir = str(Path(sheeprl.__file__).parent / "configs")
    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    cfg = dotdict(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))

    fabric = Fabric(accelerator="cpu", devices=1, precision="32-true")
    fabric.launch()
    obs_space = gym.spaces.Dict(
        {key: gym.spaces.Box(0, 255, (3, 64, 64), np.uint8) if a.obs == "image"
         else gym.spaces.Box(-1, 1, (4,), np.float32)})
    actions_dim = (6,)
    torch.manual_seed(0)
    world_model, actor, critic, target_critic, _player = build_agent(
        fabric, actions_dim, False, cfg, obs_space)
    inst = lambda c, m: hydra.utils.instantiate(c, params=m.parameters(), _convert_="all")  # noqa: E731
    opts = fabric.setup_optimizers(inst(cfg.algo.world_model.optimizer, world_model),
                                   inst(cfg.algo.actor.optimizer, actor),
                                   inst(cfg.algo.critic.optimizer, critic))
    m = cfg.algo.actor.moments
    moments = Moments(m.decay, m.max, m.percentile.low, m.percentile.high)

    g = torch.Generator().manual_seed(0)
    obs = (torch.randint(0, 256, (T, B, 3, 64, 64), generator=g).float() if a.obs == "image"
           else torch.randn(T, B, 4, generator=g))
    data = {key: obs,
            "actions": torch.nn.functional.one_hot(torch.randint(0, 6, (T, B), generator=g),
                                                   6).float(),
            "rewards": torch.randn(T, B, 1, generator=g),
            "terminated": (torch.rand(T, B, 1, generator=g) < 0.01).float(),
            "truncated": torch.zeros(T, B, 1),
            "is_first": (torch.rand(T, B, 1, generator=g) < 0.01).float()}
    tau = cfg.algo.critic.tau

    def update(batch):  # the target-critic update its loop does before each train() is timed
        for cp, tcp in zip(critic.module.parameters(), target_critic.parameters()):
            tcp.data.copy_(tau * cp.data + (1 - tau) * tcp.data)
        train(fabric, world_model, actor, critic, target_critic, *opts, batch, None, cfg,
              False, actions_dim, moments)

    # train() writes into is_first: each update gets a fresh copy (made untimed)
    times = time_updates(update, a, prepare=lambda: {k: v.clone() for k, v in data.items()})
    import importlib.metadata as md
    report("sheeprl", md.version("sheeprl"), a, times, horizon=cfg.algo.horizon)


if __name__ == "__main__":
    main()
