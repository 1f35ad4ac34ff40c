import json
import math

import numpy as np
import pytest
import torch

from lucid.config import ConfigError, make_config
from lucid.train import Trainer


def _cfg(tmp_path, **over):
    base = {
        "env": {"id": "CartPole-v1", "num_envs": 2},
        "model": {"size": "nano"},
        "train": {"batch_size": 4, "batch_length": 16, "horizon": 5, "prefill": 20,
                  "replay_capacity": 10_000},
        "run": {"steps": 60, "log_every": 0.0, "progress": False, "run_dir": str(tmp_path)},
    }
    for sec, kv in over.items():
        base[sec].update(kv)
    return make_config("default", **base)


@pytest.mark.parametrize("ratio", [32, 512, 1024])
def test_train_ratio_is_honoured_exactly(tmp_path, ratio):
    cfg = _cfg(tmp_path, train={"train_ratio": ratio}, run={"steps": 40 if ratio > 32 else 120})
    tr = Trainer(cfg)
    tr.run()
    c = tr.counters
    expected = math.floor((c["env_steps"] - 20) * ratio / (4 * 16))
    assert c["updates"] == expected
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert rows[-1]["updates"] == expected
    assert {"env_steps", "updates", "wall_time", "world_model/loss", "actor/loss",
            "critic/loss"} <= set(rows[-1])


def test_resume_continues_counters_replay_and_optimisers(tmp_path):
    cfg = _cfg(tmp_path, train={"train_ratio": 64})
    first = Trainer(cfg)
    first.run()
    c1 = dict(first.counters)
    data1 = {k: v.copy() for k, v in first.replay.data.items()}
    params1 = [p.detach().clone() for p in first.agent.wm.parameters()]
    adam_step1 = first.agent.opt_wm.state_dict()["state"][0]["step"]
    first.close()

    again = Trainer(make_config("default", run={"steps": 0}), tmp_path, resume=True)
    assert again.counters == c1
    for k, v in data1.items():
        np.testing.assert_array_equal(again.replay.data[k], v)
    for a, b in zip(params1, again.agent.wm.parameters()):
        assert torch.equal(a, b)
    assert again.agent.opt_wm.state_dict()["state"][0]["step"] == adam_step1
    again.close()

    more = Trainer(make_config("default", run={"steps": 100}), tmp_path, resume=True)
    more.run()
    more.close()
    assert more.counters["env_steps"] >= 100 > c1["env_steps"]
    assert more.counters["updates"] > c1["updates"]
    assert more.counters["updates"] == math.floor((more.counters["env_steps"] - 20) * 64 / 64)


def test_config_rejects_unknown_keys_with_a_suggestion():
    with pytest.raises(ConfigError, match="train.train_ration.*train.train_ratio"):
        make_config("default", ["train.train_ration=3"])
    with pytest.raises(ConfigError, match="model.size"):
        make_config("default", ["model.size=XXL"])
    with pytest.raises(ConfigError, match="train.batch_size.*'abc'.*Integer") as bad:
        make_config("default", ["train.batch_size=abc"])
    assert "\n" not in str(bad.value)  # one line, without OmegaConf's internals
    with pytest.raises(ConfigError, match="preset"):
        make_config("cpu-contrl")
    with pytest.raises(ConfigError, match=r"train.batch_size >= 1 .*\(got train.batch_size=0, "
                                          r"train.batch_length=64\)"):  # the values given
        make_config("default", ["train.batch_size=0"])
