import json
import math
import random

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


def test_target_return_is_the_mean_of_the_last_10_episodes(tmp_path):
    """Returns 100, 90, 80, ...: the mean of the last 10 reaches 55 at the 10th episode (the
    first episodes alone reach it at once), and `recent` keeps the newest 10."""
    env = {"id": "envs_for_tests:FallingReturnsEnv", "num_envs": 1}
    tr = Trainer(_cfg(tmp_path / "a", env=env, train={"prefill": 1000},
                      run={"steps": 200, "target_return": 55.0}))
    with tr:
        tr.run()
    assert tr.counters["episodes"] == 10 and "target_return=55" in tr.stop_reason
    tr = Trainer(_cfg(tmp_path / "b", env=env, train={"prefill": 1000}, run={"steps": 46}))
    with tr:
        tr.run()
    n = tr.counters["episodes"]
    assert n > 10 and tr.recent == [100.0 - 10 * e for e in range(n - 10, n)]


def test_a_resume_keeps_the_crafter_score_of_the_episodes_before_it(tmp_path):
    env = {"id": "envs_for_tests:AchievingEnv", "num_envs": 1}
    first = Trainer(_cfg(tmp_path, env=env, train={"prefill": 1000}, run={"steps": 30}))
    with first:
        first.run()
    before = first.achievements.metrics()
    assert before["crafter/episodes"] == first.counters["episodes"] >= 5
    assert 0 < before["crafter/score"] < 100
    again = Trainer(make_config("default", run={"steps": 0}), tmp_path, resume=True)
    again.close()
    assert again.achievements.metrics() == before


def test_random_actions_fill_the_prefill_then_the_agent_acts(tmp_path):
    tr = Trainer(_cfg(tmp_path, train={"train_ratio": 16}))  # 2 envs, prefill 20, 60 steps
    real, rows = tr.agent.policy, []

    def counted(obs, *args, **kwargs):
        rows.append((tr.counters["env_steps"], next(iter(obs.values())).shape[0]))
        return real(obs, *args, **kwargs)

    tr.agent.policy = counted
    with tr:
        tr.run()
    assert rows == [(s, 2) for s in range(20, 60, 2)]


# (env steps after the 20 of prefill) x ratio / (B·T = 64 replayed steps per update), by hand
@pytest.mark.parametrize("ratio,steps,expected", [(32, 120, 50), (512, 40, 160),
                                                  (1024, 40, 320)])
def test_train_ratio_is_honoured_exactly(tmp_path, ratio, steps, expected):
    cfg = _cfg(tmp_path, train={"train_ratio": ratio}, run={"steps": steps})
    tr = Trainer(cfg)
    tr.run()
    c = tr.counters
    assert c["env_steps"] == steps and c["updates"] == expected
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert rows[-1]["updates"] == expected
    assert {"env_steps", "updates", "wall_time", "world_model/loss", "actor/loss",
            "critic/loss"} <= set(rows[-1])


def test_resume_continues_counters_replay_and_optimisers(tmp_path):
    cfg = _cfg(tmp_path, train={"train_ratio": 64})
    first = Trainer(cfg)
    random.random(), np.random.random()  # as an env's own draws would move them
    first.run()
    c1, recent1 = dict(first.counters), list(first.recent)
    data1 = {k: v.copy() for k, v in first.replay.data.items()}
    params1 = [p.detach().clone() for p in first.agent.wm.parameters()]
    adam_step1 = first.agent.opt_wm.state_dict()["state"][0]["step"]
    first.close()

    again = Trainer(make_config("default", run={"steps": 0}), tmp_path, resume=True)
    assert again.counters == c1
    assert again.recent == recent1 != []  # run.target_return's last 10 returns
    # the random streams go on from the checkpoint: Python's, numpy's and torch's
    from lucid.checkpoint import _decode_np_state, _decode_py_state, load_latest
    saved = load_latest(tmp_path)[0]["rng"]
    assert torch.equal(torch.get_rng_state(), saved["torch"])
    live_np, saved_np = np.random.get_state(), _decode_np_state(saved["numpy"])
    assert live_np[0] == saved_np[0] and np.array_equal(live_np[1], saved_np[1]) \
        and live_np[2:] == saved_np[2:]
    assert random.getstate() == _decode_py_state(saved["python"])
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


def test_a_metric_row_holds_the_mean_over_its_updates(tmp_path):
    """Metrics are summed on the device between rows; the row divides by the updates."""
    tr = Trainer(_cfg(tmp_path, train={"train_ratio": 32}, run={"log_every": 1e9}))
    real, count = tr.agent.train_step, iter(range(10_000))

    def numbered(batch):  # update i reports a world-model loss of i
        m = real(batch)
        m["world_model/loss"] = torch.tensor(float(next(count)))
        return m

    tr.agent.train_step = numbered
    with tr:
        tr.run()
    (row,) = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]  # the end's
    n = tr.counters["updates"]
    assert n > 2 and row["world_model/loss"] == pytest.approx((n - 1) / 2)


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


def test_the_time_limit_counts_each_session_and_the_reason_is_given(tmp_path):
    """run.time_limit stops a session with a checkpoint, and a resumed run gets a session of
    its own (it used to count the whole run's wall time, so a resume stopped at once)."""
    cfg = _cfg(tmp_path, train={"prefill": 10**6},  # random actions only: fast steps
               run={"steps": 10**6, "time_limit": 0.5 / 60})
    tr = Trainer(cfg)
    tr.run()
    tr.close()
    first = tr.counters["env_steps"]
    assert 0 < first < 10**6 and tr.stop_reason == "run.time_limit=0.00833333 minutes reached"
    again = Trainer(make_config("default", run={"steps": 10**6}), tmp_path, resume=True)
    again.run()
    again.close()
    assert again.counters["env_steps"] > first and again.counters["wall_time"] >= 0.9


def test_a_run_learns_on_a_thread_other_than_the_main_one(tmp_path):
    """learn() from a worker thread (a GUI, Ray Tune's function trainables): Python lets only
    the main thread install signal handlers, so there it trains without them."""
    import signal
    import threading
    before = signal.getsignal(signal.SIGINT)
    out = {}

    def work():
        tr = Trainer(_cfg(tmp_path))
        try:
            tr.run()
            out["counters"] = dict(tr.counters)
        except BaseException as exc:  # noqa: BLE001 - reported below
            out["error"] = exc
        finally:
            tr.close()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert "error" not in out, out.get("error")
    assert out["counters"]["env_steps"] == 60 and out["counters"]["updates"] > 0
    assert signal.getsignal(signal.SIGINT) is before
