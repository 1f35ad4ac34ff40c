import dataclasses
import json
import math
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lucid.config import ConfigError, for_device, make_config
from lucid.acting import ActingRun, load_to_act
from lucid.device import gpu_speed_note
from lucid.checkpoint import load_latest
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


def test_resume_continues_counters_replay_and_optimizers(tmp_path):
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


def test_a_resume_refuses_a_config_yaml_that_changed_what_the_checkpoint_was_made_for(tmp_path):
    """config.yaml edited before a resume: env.num_envs (the replay's streams) and the model
    are named and refused before anything is written; the runner counts of a local run shape
    nothing and are taken."""
    with Trainer(_cfg(tmp_path, run={"steps": 4})) as tr:  # random actions: a checkpoint
        tr.run()
    path = tmp_path / "config.yaml"
    saved = path.read_text()

    def edited(*pairs):
        text = saved
        for old, new in pairs:
            assert text.count(old) == 1, old
            text = text.replace(old, new)
        path.write_text(text)

    edited(("num_envs: 2", "num_envs: 3"), ("size: nano", "size: micro"))
    with pytest.raises(ConfigError, match=r"env.num_envs: 2 in the checkpoint, 3 in config.yaml; "
                                          r"model.size: 'nano' in the checkpoint, 'micro' in "
                                          r"config.yaml\. Put those values back"):
        Trainer(make_config("default", run={"steps": 8}), tmp_path, resume=True)
    edited(("num_runners: 2", "num_runners: 5"), ("envs_per_runner: 1", "envs_per_runner: 3"))
    with Trainer(make_config("default", run={"steps": 8}), tmp_path, resume=True) as again:
        again.run()
    assert again.counters["env_steps"] == 8


def test_a_run_within_the_prefill_says_it_makes_no_update(tmp_path, said):
    """run.steps <= train.prefill: all random actions, said before the run; one step more
    than the prefill is an update's worth of steps, and nothing is said."""
    with Trainer(_cfg(tmp_path / "a", run={"steps": 20})) as tr:  # prefill 20
        tr.run()
    assert "note: run.steps=20 ends within the 20 random-action steps of train.prefill" \
        in said() and tr.counters["updates"] == 0
    with Trainer(_cfg(tmp_path / "b", train={"batch_size": 2, "batch_length": 8,
                                             "train_ratio": 16}, run={"steps": 22})) as tr:
        tr.run()
    assert "random-action steps" not in said() and tr.counters["updates"] == 2


def test_a_run_too_short_for_one_window_says_it_makes_no_update(tmp_path, said):
    """run.steps past the prefill but below one train.batch_length window per env: no update
    could be made, which the run used to end with silently; a window's worth is enough."""
    over = {"batch_size": 2, "batch_length": 16, "prefill": 4, "train_ratio": 16}
    with Trainer(_cfg(tmp_path / "a", env={"num_envs": 2}, train=over,
                      run={"steps": 30})) as tr:
        tr.run()
    assert "note: run.steps=30 gives each of the 2 env(s) 15 steps, fewer than one " \
           "window of 16 (train.batch_length), so no update will be made" in said()
    assert tr.counters["updates"] == 0
    with Trainer(_cfg(tmp_path / "b", env={"num_envs": 2}, train=over,
                      run={"steps": 34})) as tr:
        tr.run()
    assert "window" not in said() and tr.counters["updates"] > 0


def test_a_run_whose_train_ratio_calls_for_no_update_says_so(tmp_path, said):
    """Past the prefill and a window per env, but (steps - prefill) x train_ratio short of
    one update's B x T replayed steps: no update, said before the run; enough steps for one
    update make it, and nothing is said."""
    over = {"batch_size": 2, "batch_length": 8, "prefill": 20, "train_ratio": 1}
    with Trainer(_cfg(tmp_path / "a", train=over, run={"steps": 30})) as tr:
        tr.run()
    assert "note: 10 env steps after train.prefill at train.train_ratio=1 call for 10 " \
           "replayed steps, fewer than the 16 of one update, so no update will be made" \
        in said()
    assert tr.counters["updates"] == 0
    with Trainer(_cfg(tmp_path / "b", train=over, run={"steps": 36})) as tr:
        tr.run()
    assert "no update" not in said() and tr.counters["updates"] == 1


def _gpu(monkeypatch, bf16=True, compile_=True):
    """What for_device sees of a GPU: whether it has bf16, and whether torch.compile can build
    kernels for it."""
    import lucid.config
    monkeypatch.setattr(lucid.config, "cuda_features", lambda: {"bf16": bf16, "compile": compile_})


def test_a_gpu_run_is_told_the_fastest_gpu_settings_it_was_set_away_from(tmp_path, said,
                                                                         monkeypatch):
    """On CUDA the note names the settings of the fastest GPU update (CUDA's defaults) that
    the agent's config was set away from; with CUDA's defaults, data-parallel, or on a CPU,
    nothing is said. The trainer says it before a run, and that compiling makes the first
    update wait."""
    _gpu(monkeypatch)
    cuda = torch.device("cuda")
    assert gpu_speed_note(for_device(make_config("default"), "cuda"), cuda) is None
    off = for_device(make_config("default", train={"cuda_graph": False, "onehot_gather": True}),
                     "cuda")
    note = gpu_speed_note(off, cuda)
    assert note.startswith("on this GPU, train.compile=true train.precision=bf16 "
                           "train.cuda_graph=true train.onehot_gather=false (the default on "
                           "CUDA) would make training faster")
    fp32 = for_device(make_config("default", train={"precision": "fp32"}), "cuda")
    assert gpu_speed_note(fp32, cuda).startswith("on this GPU, train.precision=bf16 (the")
    assert gpu_speed_note(off, cuda, data_parallel=True) is None
    assert gpu_speed_note(for_device(make_config("default"), "cpu"), torch.device("cpu")) \
        is None
    given = _cfg(tmp_path / "a", run={"steps": 20})
    with Trainer(given) as tr:
        tr._notes()
        out = said()
        assert "on this GPU" not in out and "train.compile=true" not in out
        tr.device = cuda  # what the notes before a run read of a GPU learner
        tr.cfg = dataclasses.replace(off, run=tr.cfg.run)
        tr._notes()
        assert f"note: {note}" in said()
        tr.cfg = for_device(given, "cuda")  # CUDA's defaults: compiled
        tr._notes()
        out = said()
        assert "on this GPU" not in out
        assert "note: train.compile=true: the update is compiled before the first one (once " \
               "per run and batch shape" in out
    _gpu(monkeypatch, bf16=False)  # e.g. a V100: fp32 is what it does best
    assert gpu_speed_note(fp32, cuda) is None


def test_settings_left_to_the_device_are_chosen_for_the_learners_device(tmp_path, monkeypatch):
    """train.cuda_graph, train.onehot_gather, train.compile, train.precision and
    train.prefetch default to null. On CUDA (one process): the graph over dense one-hots,
    compiled where triton is, in bf16 where the GPU has it and the update is compiled; each
    follows from the one before. Data-parallel CUDA learners and CPUs: eager fp32 without a
    graph; a CPU gathers. CUDA prefetches batches, a CPU does not. Set values are kept. The run has one config, the
    device's choice, which is its agent's; config.yaml and checkpoints keep the nulls for the
    next device."""
    _gpu(monkeypatch)
    keys = ("cuda_graph", "onehot_gather", "compile", "precision", "prefetch")
    choice = lambda c: tuple(getattr(c.train, k) for k in keys)  # noqa: E731
    cfg = make_config("default")
    assert choice(cfg) == (None,) * 5
    assert choice(for_device(cfg, "cuda")) == (True, False, True, "bf16", True)
    assert choice(for_device(cfg, "cpu")) == (False, True, False, "fp32", False)
    assert choice(for_device(cfg, "cuda", data_parallel=True)) \
        == (False, False, False, "fp32", True)
    assert choice(cfg) == (None,) * 5  # a copy
    # the Nature recipe has no graphed update yet: eager fp32 unless train.compile is set
    nature = for_device(make_config("nature"), "cuda")
    assert choice(nature) == (False, False, False, "fp32", True)
    assert gpu_speed_note(nature, torch.device("cuda")) is None
    gpu = for_device(cfg, "cuda")
    assert gpu.train.model_lr == cfg.train.model_lr and gpu.model == cfg.model
    for set_, chosen in [({"cuda_graph": False}, (False, False, False, "fp32")),
                         ({"compile": False}, (True, False, False, "fp32")),
                         ({"precision": "fp32"}, (True, False, True, "fp32")),
                         ({"compile": True, "cuda_graph": False}, (False, False, True, "fp32"))]:
        assert choice(for_device(make_config("default", train=set_), "cuda")) \
            == (*chosen, True), set_
    _gpu(monkeypatch, bf16=False, compile_=False)  # an old GPU, no triton (Windows)
    assert choice(for_device(cfg, "cuda")) == (True, False, False, "fp32", True)
    _gpu(monkeypatch, bf16=False)
    assert choice(for_device(cfg, "cuda")) == (True, False, True, "fp32", True)
    set_ = make_config("default", train=dict(zip(keys, (False, True, False, "bf16", False))))
    assert for_device(set_, "cuda") is set_  # nothing left to choose
    with Trainer(_cfg(tmp_path / "a", run={"steps": 20})) as tr:
        assert choice(tr.agent.config) == (False, True, False, "fp32", False)
        assert tr.cfg is tr.agent.config
        assert choice(tr.saved_config()) == (None,) * 5
        tr.run()  # a checkpoint to load below
        assert "onehot_gather: null" in load_latest(tmp_path / "a")[0]["config"]
        assert not tr._batches.background  # sampled as the agent's config chose
    saved = (tmp_path / "a" / "config.yaml").read_text()
    for k in keys:
        assert f"{k}: null" in saved
    # An agent loaded to act (eval, dream) is not compiled unless asked: the trainer leaves
    # train.compile to the device only when it learns.
    import lucid.device
    asked = []
    monkeypatch.setattr(lucid.device, "for_device",
                        lambda c, *a, **k: (asked.append(c.train.compile), for_device(c, *a, **k))[1])
    with load_to_act(tmp_path / "a"):
        pass
    yaml_path = tmp_path / "a" / "config.yaml"
    yaml_path.write_text(saved.replace("compile: null", "compile: true"))  # asked for
    with load_to_act(tmp_path / "a"):
        pass
    with Trainer(_cfg(tmp_path / "b", run={"steps": 20})):
        pass
    assert asked == [False, True, None]
    # The trainer samples on a thread where the agent's config chose it (CUDA): here forced.
    monkeypatch.setattr(lucid.device, "for_device", lambda c, *a, **k: dataclasses.replace(
        c, train=dataclasses.replace(for_device(c, *a, **k).train, prefetch=True)))
    with Trainer(_cfg(tmp_path / "c", run={"steps": 20})) as tr:
        tr.run()
        assert tr._batches.background and tr.cfg.train.prefetch
        assert tr.saved_config().train.prefetch is None


def test_an_agent_made_to_act_is_compiled_when_it_learns_where_the_device_compiles(
        tmp_path, monkeypatch):
    """Dreamer makes its agent with a Trainer that only acts (not compiled) and trains that
    agent at its first learn(): where the device's choice is to compile (CUDA's), the
    learning Trainer compiles it, with the precision that goes with it; a train.compile set
    in the config is left as it is."""
    import lucid.device
    from lucid.agent import COMPILE_CHUNK
    real = lucid.device.for_device

    def compiling_device(c, *a, **k):  # CUDA's choice, on this CPU (no graph: that needs CUDA)
        got = real(c, *a, **k)
        if c.train.compile is None:
            got = dataclasses.replace(got, train=dataclasses.replace(
                got.train, compile=True, precision="bf16"))
        return got
    monkeypatch.setattr(lucid.device, "for_device", compiling_device)
    for compile_, learns_compiled in [(None, True), (False, False)]:
        cfg = _cfg(tmp_path / str(compile_), train={"compile": compile_})
        with ActingRun(cfg) as acting:
            agent = acting.agent
        assert not agent.config.train.compile and agent.config.train.precision == "fp32"
        assert agent.wm.chunk != COMPILE_CHUNK  # (what Agent.compile sets)
        with Trainer(cfg, agent=agent) as tr:
            assert tr.agent is agent
            assert agent.config.train.compile is learns_compiled
            assert agent.config.train.precision == ("bf16" if learns_compiled else "fp32")
            assert (agent.wm.chunk == COMPILE_CHUNK) is learns_compiled


def test_what_for_device_reads_of_a_gpu(monkeypatch, tmp_path):
    """cuda_features: bf16 is assumed where CUDA is absent (a config chosen for a GPU
    elsewhere), else asked of the GPU; compiling needs triton, a GPU of compute capability
    7.0 or newer (assumed likewise), a C compiler and Python's headers (triton builds its
    kernel launcher with them)."""
    import importlib.util
    import shutil
    import sysconfig
    from lucid.config import cuda_features
    got = cuda_features()
    if not torch.cuda.is_available():
        assert got["bf16"]
    else:
        assert got["bf16"] == torch.cuda.is_bf16_supported(including_emulation=False)
    found = importlib.util.find_spec
    for triton, cc, headers in [(True, True, True), (False, True, True), (True, False, True),
                                (True, True, False)]:
        with monkeypatch.context() as m:
            m.setattr(importlib.util, "find_spec",
                      lambda name, *a: (object() if triton else None) if name == "triton"
                      else found(name, *a))
            m.setenv("CC", "/usr/bin/cc" if cc else "/nowhere/cc")  # a $CC that is not there
            m.setattr(shutil, "which", lambda name: "/usr/bin/cc" if cc else None)
            include = sysconfig.get_paths()["include"] if headers else str(tmp_path)
            m.setattr(sysconfig, "get_paths", lambda: {"include": include})
            if headers:
                assert (Path(include) / "Python.h").is_file()  # (a venv of CI's python)
            assert cuda_features()["compile"] == (triton and cc and headers)
            if triton and cc and headers:  # a Pascal GPU: triton does not build for it
                m.setattr(torch.cuda, "is_available", lambda: True)
                m.setattr(torch.cuda, "is_bf16_supported", lambda **k: False)
                m.setattr(torch.cuda, "get_device_capability", lambda *a: (6, 1))
                assert cuda_features() == {"bf16": False, "compile": False}
                m.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))  # a T4
                assert cuda_features() == {"bf16": False, "compile": True}
                m.setattr(torch.cuda, "is_bf16_supported", lambda: True)  # torch < 2.5
                m.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
                assert cuda_features() == {"bf16": True, "compile": True}


def _saving(tr) -> list:
    """The env steps at which `tr` saves a checkpoint, as it saves them."""
    real, at = tr.save, []
    tr.save = lambda: (at.append(tr.counters["env_steps"]), real())[1]
    return at


def test_checkpoint_every_counts_env_steps_from_the_last_checkpoint(tmp_path):
    """run.checkpoint_every=20 (2 envs): checkpoints at 20, 40 and 60 env steps, then the
    end's; a resume at 60 counts from there (the next at 80, not at once)."""
    cfg = _cfg(tmp_path, train={"prefill": 10**6}, run={"checkpoint_every": 20})  # fast steps
    with Trainer(cfg) as tr:
        at = _saving(tr)
        tr.run()
    assert at == [20, 40, 60, 60]
    with Trainer(make_config("default", run={"steps": 90}), tmp_path, resume=True) as again:
        at = _saving(again)
        again.run()
    assert at == [80, 90]


def test_each_metric_row_covers_the_updates_and_time_since_the_row_before(tmp_path):
    """log_every=0: a row after every env step. Each one's metrics are the mean over the
    updates since the previous row (none: no such keys), its rates count the env steps and
    updates since then over the same interval, and wall_time is the run's time so far."""
    cfg = _cfg(tmp_path, train={"batch_size": 2, "batch_length": 8, "train_ratio": 4},
               run={"steps": 40, "logger": "none"})  # an update every other step after prefill
    tr = Trainer(cfg)
    real, count = tr.agent.train_step, iter(range(10_000))

    def numbered(batch):  # update i reports a world-model loss of i, and takes 20 ms at least
        m = real(batch)
        m["world_model/loss"] = torch.tensor(float(next(count)))
        time.sleep(0.02)
        return m

    tr.agent.train_step = numbered
    with tr:
        tr.run()
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["env_steps"] for r in rows] == list(range(2, 42, 2)) and rows[-1]["updates"] == 5
    before = {"env_steps": 0, "updates": 0, "wall_time": 0.0}
    for row in rows:
        new = row["updates"] - before["updates"]
        if new:
            assert row["world_model/loss"] == pytest.approx(np.mean(range(before["updates"],
                                                                          row["updates"])))
        else:
            assert "world_model/loss" not in row and row["perf/updates_per_s"] == 0
        env_rate, update_rate = row["perf/env_steps_per_s"], row["perf/updates_per_s"]
        assert env_rate * new == pytest.approx(update_rate * (row["env_steps"]
                                                              - before["env_steps"]))
        assert row["wall_time"] >= max(before["wall_time"], 0.02 * row["updates"] - 0.01)
        before = row


def test_each_evaluation_starts_its_episodes_from_seeds_of_its_own(tmp_path):
    """run.eval_every: the evaluation at N env steps seeds its envs from run.seed + 10000 + N,
    so two evaluations play different episodes, not the same ones again (the env's returns
    come from its seed alone), and a run evaluates as the same run did before."""
    def eval_returns(run_dir):
        cfg = _cfg(run_dir, env={"id": "envs_for_tests:SeededReturnEnv"},
                   train={"prefill": 10**6},
                   run={"steps": 40, "eval_every": 20, "eval_episodes": 2, "logger": "none"})
        with Trainer(cfg) as tr:
            tr.run()
        rows = [json.loads(line) for line in open(run_dir / "episodes.jsonl")]
        return {(s, p): [r["return"] for r in rows if r["eval"] and r["policy"] == p
                         and r["env_steps"] == s] for s in (20, 40) for p in ("greedy", "sampled")}

    first = eval_returns(tmp_path / "a")
    assert all(len(rets) == 2 for rets in first.values()), first
    assert first[20, "greedy"] != first[40, "greedy"]
    assert eval_returns(tmp_path / "b") == first


def test_a_resumed_trainer_run_twice_keeps_the_rows_of_its_first_run(tmp_path):
    """A resume drops the rows a killed run logged past its checkpoint once, at its first
    run(); a second run() (Dreamer.learn again) keeps what the first one logged."""
    cfg = _cfg(tmp_path, env={"id": "envs_for_tests:CountEnv"}, train={"prefill": 10**6},
               run={"steps": 20})  # episodes of 3 steps
    with Trainer(cfg) as tr:
        tr.run()
    with Trainer(make_config("default", run={"steps": 30}), tmp_path, resume=True) as again:
        again.run()
        again.cfg.run.steps = 40
        again.run()
    for name in ("metrics.jsonl", "episodes.jsonl"):
        steps = [json.loads(line)["env_steps"] for line in open(tmp_path / name)]
        assert steps == sorted(steps) and any(20 < s <= 30 for s in steps), (name, steps)
    steps = [json.loads(line)["env_steps"] for line in open(tmp_path / "metrics.jsonl")]
    assert steps == list(range(2, 42, 2))


def test_env_steps_count_each_episodes_reset_step(tmp_path):
    """As the authors' driver counts: an episode of L actions moves env_steps by L + 1 (its
    reset step, the vector env's autoreset, is a replay step too), summed over envs; its row
    says length L (docs/algorithm.md, data convention)."""
    cfg = _cfg(tmp_path, env={"id": "envs_for_tests:CountEnv", "num_envs": 2},
               train={"prefill": 10**6}, run={"steps": 24})  # episodes of 3 actions
    with Trainer(cfg) as tr:
        tr.run()
    rows = [json.loads(line) for line in open(tmp_path / "episodes.jsonl")]
    assert [(r["env_steps"], r["length"]) for r in rows] == [
        (s, 3) for s in (8, 8, 16, 16, 24, 24)]
    assert tr.replay.count == 12  # steps per env: one replay step per env step


def test_checkpoint_minutes_and_the_time_limit_are_minutes(tmp_path):
    """run.time_limit=3/60: a session of 3 seconds (not 3 minutes, nor 4.5 seconds: the
    bound leaves 1.4 s for the last step on a loaded machine); run.checkpoint_minutes=1 over
    it: no checkpoint but the end's."""
    tr = Trainer(_cfg(tmp_path, train={"prefill": 10**6},  # random actions only: fast steps
                      run={"steps": 10**6, "time_limit": 3 / 60, "checkpoint_minutes": 1}))
    at = _saving(tr)
    with tr:
        tr.run()
    assert len(at) == 1 and at[0] == tr.counters["env_steps"] > 0
    assert 3 <= tr.counters["wall_time"] < 4.4 and "time_limit" in tr.stop_reason


def test_a_replay_that_holds_exactly_one_window_per_env_trains(tmp_path):
    """train.replay_capacity = batch_length x num_envs: one window per env stream, enough."""
    cfg = _cfg(tmp_path, train={"batch_size": 2, "batch_length": 8, "train_ratio": 16,
                                "replay_capacity": 16}, run={"steps": 24})
    with Trainer(cfg) as tr:
        tr.run()
    assert tr.replay.per_env == 8 and tr.counters["updates"] == 4


def test_a_callback_returning_none_goes_on_and_a_resume_takes_only_run_settings(tmp_path):
    """callback(info) -> None after each episode: the run goes on to run.steps. A resume
    takes the RESUME_SETTABLE keys it is given, and refuses any other by name."""
    cfg = _cfg(tmp_path, env={"id": "envs_for_tests:CountEnv"}, train={"prefill": 10**6},
               run={"steps": 30})  # episodes of 3 steps
    seen = []
    with Trainer(cfg) as tr:
        tr.run(callback=lambda info: seen.append(info["episodes"]))
    assert tr.counters["env_steps"] == 30 and len(seen) == tr.counters["episodes"] >= 5
    with pytest.raises(ConfigError, match="train.train_ratio cannot be changed on resume"):
        Trainer(make_config("default", train={"train_ratio": 64}), tmp_path, resume=True,
                settings=("train.train_ratio",))
    again = Trainer(make_config("default", run={"steps": 0, "eval_episodes": 7}), tmp_path,
                    resume=True, settings=("run.eval_episodes",))
    again.close()
    assert again.cfg.run.eval_episodes == 7 and again.cfg.train.train_ratio == 512
