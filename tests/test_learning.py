"""Learning is tested by learning: the default CPU preset must lift CartPole-v1 well above
the random policy's return (~22) on this 2-core CPU.

The bar (mean of the last 10 episodes >= 50 within 20,000 env steps, seed 0) sits far below what
the preset reaches in benchmarks/learning.py (running means of 100 after ~11,000 steps and
300-400 at their best within 10 minutes, seeds 0 and 1), so machine noise and thread-count
nondeterminism do not make it flaky; the run stops as soon as the bar is reached (about 9,000
steps, 2-3 minutes here; one run of the suite under heavy load missed the earlier bar of 60
within 15,000 steps, hence the margin). A broken loss, sign or time shift keeps the return near the random
policy's, far below the bar.
"""

import json

from lucid.config import make_config
from lucid.train import Trainer


def test_cpu_preset_learns_cartpole(tmp_path):
    cfg = make_config("cpu-control", env={"id": "CartPole-v1"},
                      run={"steps": 20_000, "seed": 0, "progress": False,
                           "run_dir": str(tmp_path), "target_return": 50.0})
    trainer = Trainer(cfg)
    trainer.run()
    returns = [json.loads(line)["return"] for line in open(tmp_path / "episodes.jsonl")]
    last10 = sum(returns[-10:]) / 10
    assert last10 >= 50.0, (
        f"mean return of the last 10 episodes {last10:.1f} after "
        f"{trainer.counters['env_steps']} env steps; returns {returns[-30:]}")
