"""ms per DreamerV3 update in RLlib (torch), run inside benchmarks/.peers/rllib by peers.py.

Builds the algorithm with a local env runner and a local learner, then times
`learner_group.update` on a synthetic (B, T) batch shaped like the replay buffer's sample
(one-hot actions, as RLlib's training_step makes them). Prints one JSON line.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from _peer_common import report, time_updates, worker_args


class ShapeEnv(gym.Env):
    """Only its spaces matter (the env runner builds it; the update never steps it)."""

    def __init__(self, config=None):
        obs = (config or {}).get("obs", "vector")
        # RLlib's image convention (as its Atari wrappers produce): float32 in [-1, 1].
        self.observation_space = (gym.spaces.Box(-1, 1, (4,), np.float32) if obs == "vector"
                                  else gym.spaces.Box(-1, 1, (64, 64, 3), np.float32))
        self.action_space = gym.spaces.Discrete(6)

    def reset(self, *, seed=None, options=None):
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


def main():
    a = worker_args()
    import ray
    from ray.rllib.algorithms.dreamerv3 import DreamerV3Config
    from ray.rllib.policy.sample_batch import SampleBatch
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME
    from ray.tune.registry import register_env

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    register_env("shape_env", lambda cfg: ShapeEnv(cfg))
    config = (DreamerV3Config()
              .framework("torch")
              .environment("shape_env", env_config={"obs": a.obs})
              .env_runners(num_env_runners=0)
              .learners(num_learners=0)
              .training(model_size=a.size, training_ratio=512, batch_size_B=a.batch,
                        batch_length_T=a.length, horizon_H=15))
    algo = config.build_algo()
    B, T = a.batch, a.length
    rng = np.random.default_rng(0)
    obs_shape = (4,) if a.obs == "vector" else (64, 64, 3)
    ints = rng.integers(0, 6, (B, T))
    sample = {
        "obs": rng.uniform(-1, 1, (B, T, *obs_shape)).astype(np.float32),
        "actions": np.eye(6, dtype=np.float32)[ints],
        "actions_ints": ints,
        "rewards": rng.standard_normal((B, T)).astype(np.float32),
        "is_first": rng.random((B, T)) < 0.01,
        "is_last": rng.random((B, T)) < 0.01,
        "is_terminated": rng.random((B, T)) < 0.01,
        "is_truncated": np.zeros((B, T), bool),
    }
    times = time_updates(
        lambda _: algo.learner_group.update(batch=SampleBatch(dict(sample)).as_multi_agent(),
                                            timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 0}), a)
    report("rllib", ray.__version__, a, times, horizon=15,
           note="image obs as float32 in [-1, 1] (RLlib's convention)")
    algo.stop()
    ray.shutdown()


if __name__ == "__main__":
    main()
