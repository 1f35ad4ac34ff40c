"""Runs that survive: incremental replay on disk, SIGKILL at any moment, non-finite updates,
crashing environments, bounded memory."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from procs import kill_group, popen_grouped, run_grouped

from lucid.checkpoint import list_checkpoints, load_latest
from lucid.config import PRESETS, ConfigError, make_config
from lucid.replay import Replay, to_batch
from lucid.acting import load_to_act
from lucid.runner import EnvError
from lucid.stops import DiskFullError, NonFiniteError
from lucid.train import Trainer

ROOT = Path(__file__).resolve().parents[1]
FIELDS = {"obs/vector": ((2,), np.float32), "action": ((1,), np.float32),
          "reward": ((), np.float32), "is_first": ((), bool), "is_last": ((), bool),
          "is_terminal": ((), bool)}


def _add(rep, t0, n):
    for t in range(t0, t0 + n):
        e = np.arange(rep.num_envs, dtype=np.float32)
        rep.add({"obs/vector": np.stack([np.full_like(e, t), e], -1),
                 "action": np.zeros((rep.num_envs, 1), np.float32),
                 "reward": np.full(rep.num_envs, t, np.float32),
                 "is_first": np.full(rep.num_envs, t % 9 == 0),
                 "is_last": np.zeros(rep.num_envs, bool),
                 "is_terminal": np.zeros(rep.num_envs, bool)})


def _stored(rep):
    """Steps in order (oldest first) as the replay sees them."""
    return rep._ordered(rep.count - rep.stored, rep.count)


# --------------------------------------------------------------------------- replay on disk

def test_replay_chunks_restore_the_same_buffer(tmp_path):
    rep = Replay(2 * 100, 2, FIELDS, directory=tmp_path, chunk_length=16)
    _add(rep, 0, 70)
    rep.flush()
    names = sorted(p.name for p in tmp_path.glob("chunk-*.npz"))
    assert names[0] == "chunk-000000000000-000000000016.npz"
    assert names[-1] == "chunk-000000000064-000000000070.npz"  # the partial tail on flush
    other = Replay(2 * 100, 2, FIELDS, directory=tmp_path, chunk_length=16)
    assert other.restore() == 70
    assert other.count == rep.count == 70
    a, b = _stored(rep), _stored(other)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    _add(other, 70, 5)  # appends continue after the restored steps
    assert _stored(other)["reward"][0, -1] == 74


def test_replay_chunks_follow_fifo_eviction_and_stay_bounded_on_disk(tmp_path):
    rep = Replay(40, 1, FIELDS, directory=tmp_path, chunk_length=10)
    _add(rep, 0, 125)
    rep.flush()
    spans = sorted(tuple(int(x) for x in p.stem.split("-")[1:]) for p in tmp_path.glob("chunk-*"))
    assert spans[-1][1] == 125
    assert all(end > 125 - 40 for _, end in spans)  # fully evicted chunks were deleted
    other = Replay(40, 1, FIELDS, directory=tmp_path)
    assert other.restore() == 40
    np.testing.assert_array_equal(_stored(other)["reward"][0], np.arange(85, 125))


def test_unreadable_newest_chunk_keeps_the_older_steps(tmp_path):
    rep = Replay(100, 1, FIELDS, directory=tmp_path, chunk_length=10)
    _add(rep, 0, 30)
    newest = sorted(tmp_path.glob("chunk-*"))[-1]
    newest.write_bytes(newest.read_bytes()[:100])  # torn write
    look = Replay(100, 1, FIELDS, directory=tmp_path)  # a reader that only looks (eval, dream)
    assert look.restore(set_aside=False) == 20 and newest.exists()
    other = Replay(100, 1, FIELDS, directory=tmp_path)
    # the newest run is broken at its end: only complete chunks before it are contiguous
    assert other.restore() == 20
    np.testing.assert_array_equal(_stored(other)["reward"][0], np.arange(20))
    assert (tmp_path / (newest.name + ".corrupt")).exists()  # set aside, not deleted
    _add(other, 20, 10)  # the stream continues from the last good step
    other.flush()
    again = Replay(100, 1, FIELDS, directory=tmp_path)
    assert again.restore() == 30


def _chunk(tmp_path, first):
    return next(tmp_path.glob(f"chunk-{first:012d}-*.npz"))


def test_a_replay_restored_into_a_larger_capacity_samples_only_restored_steps(tmp_path):
    """`train.replay_capacity` raised before a resume: the ring holds the 30 restored steps
    in 100 slots, and windows are drawn from those 30 alone (not from never-written zeros)."""
    rep = Replay(30, 1, FIELDS, directory=tmp_path, chunk_length=10)
    _add(rep, 1, 60)  # rewards 1..60; the last 30 are kept
    bigger = Replay(100, 1, FIELDS, directory=tmp_path)
    assert bigger.restore() == 30 and len(bigger) == 30 and bigger.count == 60
    np.testing.assert_array_equal(_stored(bigger)["reward"][0], np.arange(31, 61))
    s = bigger.sample(2000, 8)["reward"]
    assert s.min() == 31 and s.max() == 60 and np.all(np.diff(s, axis=1) == 1)
    assert not bigger.can_sample(31) and bigger.can_sample(30)
    _add(bigger, 61, 20)  # the stream goes on; now 50 stored
    assert len(bigger) == 50 and bigger.sample(500, 50)["reward"].min() == 31


@pytest.mark.parametrize("bad", [0, 10, 20])  # the oldest chunk, one in the middle, the one before the newest
def test_an_unreadable_older_chunk_keeps_the_newer_steps(tmp_path, bad):
    rep = Replay(100, 1, FIELDS, directory=tmp_path, chunk_length=10)
    _add(rep, 0, 40)
    torn = _chunk(tmp_path, bad)
    torn.write_bytes(torn.read_bytes()[:100])
    (tmp_path / "chunk-000000000040-000000000050.npz.tmp").write_bytes(b"torn")  # killed in a flush
    other = Replay(100, 1, FIELDS, directory=tmp_path)
    assert other.restore() == 30 - bad and other.count == 40
    np.testing.assert_array_equal(_stored(other)["reward"][0], np.arange(bad + 10, 40))
    assert other.sample(500, 30 - bad)["reward"].min() == bad + 10
    assert (tmp_path / (torn.name + ".corrupt")).exists()
    assert not list(tmp_path.glob("*.tmp"))
    if bad:  # older chunks stay on disk, behind the gap: a later restore does not cross it
        assert _chunk(tmp_path, 0).exists()
    _add(other, 40, 10)
    other.flush()
    again = Replay(100, 1, FIELDS, directory=tmp_path)
    assert again.restore() == 40 - bad
    np.testing.assert_array_equal(_stored(again)["reward"][0], np.arange(bad + 10, 50))


def test_restore_holds_one_chunk_at_a_time(tmp_path):
    """Restoring reads a chunk and copies it into the ring before reading the next, so the
    memory it takes beyond the ring is about one chunk, not the replay (a memmapped replay
    can be larger than RAM)."""
    import tracemalloc
    fields = {"obs/image": ((64, 64, 3), np.uint8), "reward": ((), np.float32)}
    rep = Replay(400, 1, fields, directory=tmp_path, chunk_length=50)
    img = np.zeros((1, 64, 64, 3), np.uint8)
    for t in range(400):
        rep.add({"obs/image": img, "reward": np.full(1, t, np.float32)})
    chunk_bytes = 50 * 64 * 64 * 3
    other = Replay(400, 1, fields, directory=tmp_path)  # the ring: allocated before tracing
    tracemalloc.start()
    try:
        assert other.restore() == 400
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * chunk_bytes, (peak, chunk_bytes)  # the replay: 8 chunks (read, a copy)
    np.testing.assert_array_equal(_stored(other)["reward"][0], np.arange(400))


def test_replay_of_other_spaces_is_refused(tmp_path):
    rep = Replay(100, 1, FIELDS, directory=tmp_path, chunk_length=10)
    _add(rep, 0, 10)
    fields = dict(FIELDS, **{"obs/vector": ((3,), np.float32)})
    with pytest.raises(ValueError, match="obs/vector"):
        Replay(100, 1, fields, directory=tmp_path).restore()


def test_memmap_replay_lives_in_files_and_samples(tmp_path):
    rep = Replay(64, 2, FIELDS, directory=tmp_path, memmap=True, chunk_length=1000)
    assert isinstance(rep.data["obs/vector"], np.memmap)
    assert (tmp_path / "ring" / "obs__vector.npy").exists()
    _add(rep, 0, 50)
    s = rep.sample(16, 8)
    assert np.all(np.diff(s["reward"], axis=1) == 1)
    assert s["reward"].min() >= 50 - 32


def test_capacity_in_bytes():
    rep = Replay(10**9, 1, {"obs/image": ((64, 64, 3), np.uint8)}, max_bytes=64 * 64 * 3 * 500)
    assert rep.per_env == 500


def _rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024


def test_rss_stays_flat_once_the_replay_is_full():
    n = 3000  # 3000 steps of 64x64x3 uint8 = 37 MB
    rep = Replay(n, 1, {"obs/image": ((64, 64, 3), np.uint8), "reward": ((), np.float32)})
    img = np.random.default_rng(0).integers(0, 255, (1, 64, 64, 3), dtype=np.uint8)
    for _ in range(n):
        rep.add({"obs/image": img, "reward": np.zeros(1, np.float32)})
    rss = []
    for lap in range(3):  # three more capacities written, batches sampled as in training
        for i in range(n):
            rep.add({"obs/image": img, "reward": np.zeros(1, np.float32)})
            if i % 100 == 0:
                rep.sample(16, 64)
        rss.append(_rss_mb())
    assert rss[2] - rss[0] < 4, rss  # no growth once full (the first lap warms the allocator)
    assert rep.nbytes == n * (64 * 64 * 3 + 4)


# --------------------------------------------------------------------------- non-finite updates

def _cfg(tmp_path, **over):
    base = {"env": {"id": "CartPole-v1"}, "model": {"size": "nano"},
            "train": {"batch_size": 2, "batch_length": 8, "horizon": 3, "prefill": 20,
                      "train_ratio": 16},
            "run": {"steps": 60, "progress": False, "run_dir": str(tmp_path), "log_every": 0.0}}
    for sec, kv in over.items():
        base.setdefault(sec, {}).update(kv)
    return make_config("default", **base)


@pytest.mark.parametrize("where,skipped,unchanged", [
    ("reward", 1, ["world_model"]),  # the model's loss only: actor and critic still learn
    ("obs", 3, ["world_model", "actor", "critic", "return_norm"]),  # NaN states: all skip
])
def test_nonfinite_batch_skips_the_steps_it_poisons(tmp_path, where, skipped, unchanged):
    tr = Trainer(_cfg(tmp_path))
    tr.run()
    batch = to_batch(tr.replay.sample(2, 8), torch.device("cpu"))
    if where == "reward":
        batch["reward"][0, 3] = float("nan")
    else:
        batch["obs"]["vector"][1, 2, 0] = float("inf")
    mods = tr.agent.modules()
    before = {k: [t.clone() for t in mods[k].state_dict().values()] for k in mods}
    adam = tr.agent.opt_wm.state_dict()["state"][0]["step"].clone()
    metrics = tr.agent.train(batch)
    assert metrics["train/nonfinite_steps"] == skipped
    for k in mods:
        same = all(torch.equal(a, b) for a, b in zip(before[k], mods[k].state_dict().values()))
        assert same == (k in unchanged), k
    assert torch.equal(tr.agent.opt_wm.state_dict()["state"][0]["step"], adam)
    tr.close()


@pytest.mark.parametrize("key", ["obs/vector", "reward"])  # all 3 steps skip, or 1
def test_run_stops_after_k_bad_updates_with_a_checkpoint_of_the_last_good_state(tmp_path, key):
    tr = Trainer(_cfg(tmp_path, train={"max_nonfinite": 3}, run={"steps": 400}))
    tr.run()  # a healthy first part
    good = [p.clone() for p in tr.agent.wm.parameters()]
    tr.replay.data[key][:] = np.nan  # corrupted memory: every batch is bad
    tr.cfg.run.steps = 800
    with pytest.raises(NonFiniteError, match="3 updates in a row"):
        tr.run()
    assert tr.counters["nonfinite_updates"] == 3
    payload, _ = load_latest(tmp_path)
    saved = payload["agent"]["modules"]["world_model"]
    for (name, _), p in zip(tr.agent.wm.named_parameters(), good):
        assert torch.equal(saved[name], p), name
    tr.close()


def test_bad_updates_that_are_not_in_a_row_do_not_stop_the_run(tmp_path):
    """max_nonfinite counts a streak: a good update in between starts it again."""
    tr = Trainer(_cfg(tmp_path, train={"max_nonfinite": 2}, run={"steps": 120}))
    real, calls = tr.agent.train_step, iter(range(10_000))

    def every_other_poisoned(batch):
        if next(calls) % 2 == 0:
            batch = {**batch, "reward": torch.full_like(batch["reward"], float("nan"))}
        return real(batch)

    tr.agent.train_step = every_other_poisoned
    with tr:
        tr.run()
    n = tr.counters["updates"]
    assert n >= 6 and tr.counters["env_steps"] == 120
    assert tr.counters["nonfinite_updates"] == (n + 1) // 2


# --------------------------------------------------------------------------- crashing envs

class FlakyEnv(gym.Env):
    """CartPole-like env whose step raises every `every` calls (counted per process)."""
    calls = 0
    observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, every: int = 37):
        self.every, self.t = every, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        FlakyEnv.calls += 1
        if FlakyEnv.calls % self.every == 0:
            raise RuntimeError("simulator crashed")
        self.t += 1
        return np.full(3, self.t / 100, np.float32), 1.0, self.t >= 20, False, {}


def make_flaky():
    return FlakyEnv()


def make_broken():
    return FlakyEnv(every=1)


def test_crashing_env_is_restarted_and_training_goes_on(tmp_path, capsys):
    cfg = _cfg(tmp_path, env={"id": "test_reliability:make_flaky", "num_envs": 2},
               run={"steps": 200})
    tr = Trainer(cfg)
    real, seen = tr._log_row, []

    def log_row(s, now):  # the restarts done by the time of each row (run.log_every=0)
        seen.append(tr.collector.restarts)
        real(s, now)

    tr._log_row = log_row
    with tr:
        tr.run()
    assert tr.counters["env_steps"] == 200 and tr.counters["updates"] > 0
    assert tr.counters["env_restarts"] >= 4
    assert "restarting it" in capsys.readouterr().out
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert rows[-1]["train/env_restarts"] == tr.counters["env_restarts"]
    # each row counts the restarts up to its own step, not those up to the row before
    assert [r["train/env_restarts"] for r in rows[:len(seen)]] == seen and seen[-1] >= 4


def test_an_episode_an_env_crash_cut_short_is_marked_and_kept_out_of_the_returns(tmp_path):
    """FlakyEnv's episodes return 20 unless a crash cuts them: those rows are marked `cut`
    and left out of the recent mean (and so run.target_return), TensorBoard's
    episode/return, `lucid plot`'s curves and `lucid report`'s numbers, which count them;
    the callback sees them with info["env_restarted"]."""
    from lucid.plot import load_run
    from lucid.report import summary
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    FlakyEnv.calls = 0
    cfg = _cfg(tmp_path, env={"id": "test_reliability:make_flaky", "num_envs": 1},
               train={"prefill": 10**6}, run={"steps": 200, "logger": "tensorboard"})
    seen = []
    with Trainer(cfg) as tr:
        tr.run(callback=seen.append)
    rows = [json.loads(line) for line in open(tmp_path / "episodes.jsonl")]
    cut = [r for r in rows if r.get("cut")]
    assert len(cut) >= 4 and all(r["return"] < 20 for r in cut)
    assert all(r["return"] == 20 for r in rows if "cut" not in r)
    assert [bool(i["info"].get("env_restarted")) for i in seen] == [
        "cut" in r for r in rows] and len(rows) > len(cut)
    assert tr.recent == [20.0] * len(tr.recent)
    metrics = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert {m["episode/return_recent"] for m in metrics if "episode/return_recent" in m} == {20}
    assert {r["return"] for r in load_run(tmp_path).episodes} == {20}
    numbers = summary(tmp_path)
    assert numbers["episodes cut short by an env crash (left out above)"] == len(cut)
    assert numbers["return, best train episode"] == 20
    assert numbers["train episodes"] == len(rows) - len(cut)
    acc = EventAccumulator(str(tmp_path / "tb")).Reload()
    assert {e.value for e in acc.Scalars("episode/return")} == {20}


def test_a_resumed_run_counts_the_env_restarts_before_it(tmp_path):
    FlakyEnv.calls = 0
    cfg = _cfg(tmp_path, env={"id": "test_reliability:make_flaky", "num_envs": 2},
               train={"prefill": 10**6}, run={"steps": 200})  # random actions: fast steps
    with Trainer(cfg) as tr:
        tr.run()
    before = tr.counters["env_restarts"]
    assert before >= 4
    with Trainer(make_config("default", run={"steps": 240}), tmp_path, resume=True) as again:
        assert again.counters["env_restarts"] == before
        again.run()
    assert again.counters["env_restarts"] >= before
    assert load_latest(tmp_path)[0]["counters"]["env_restarts"] == again.counters["env_restarts"]
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert rows[-1]["train/env_restarts"] == again.counters["env_restarts"]


def test_a_resumed_run_steps_its_envs_from_other_seeds_than_its_start(tmp_path):
    """The collector's seed moves on with the counters: a resume's envs start elsewhere (and
    its random actions differ) rather than replaying the run's first episodes."""
    cfg = _cfg(tmp_path, env={"num_envs": 2}, train={"prefill": 10**6}, run={"steps": 40})
    with Trainer(cfg) as tr:
        tr.run()
    with Trainer(make_config("default", run={"steps": 60}), tmp_path, resume=True) as again:
        again.run()
    s = _stored(again.replay)
    assert s["is_first"][:, 0].all() and s["is_first"][:, 20].all()  # 40 env steps: 20 each
    assert not np.array_equal(s["obs/vector"][:, 0], s["obs/vector"][:, 20])
    assert not np.array_equal(s["action"][:, 1:10], s["action"][:, 21:30])


def test_env_that_keeps_crashing_stops_the_run_with_a_clear_error(tmp_path):
    cfg = _cfg(tmp_path, env={"id": "test_reliability:make_broken", "max_restarts": 3})
    tr = Trainer(cfg)
    with pytest.raises(RuntimeError, match=r"env.max_restarts=3 times; last error: RuntimeError: "
                       r"simulator crashed \(at \S+test_reliability.py:\d+ in step\); each of "
                       r"the last 3 rebuilt envs raised before completing a step, so the "
                       r"fault is not transient"):
        tr.run()
    tr.close()


def test_restarts_of_an_env_that_recovers_in_between_are_not_called_permanent():
    from lucid.runner import EnvError, Restarting
    env = Restarting(lambda: FlakyEnv(every=2), max_restarts=2)
    env.reset()
    with pytest.raises(EnvError) as err:  # steps succeed between the crashes
        for _ in range(20):
            env.step(0)
    assert "env.max_restarts=2" in str(err.value) and "not transient" not in str(err.value)


def test_a_failed_step_ends_the_episode_at_its_last_observation():
    """The step that raised is a truncation at the observation the env last gave (reward 0):
    the next observation of the rebuilt env is the first of a new episode, after a reset."""
    from lucid.runner import Restarting
    FlakyEnv.calls = 0
    env = Restarting(lambda: FlakyEnv(every=3), max_restarts=2)
    env.reset()
    env.step(0)
    obs, _, _, _, _ = env.step(0)
    np.testing.assert_array_equal(obs, np.full(3, 0.02, np.float32))
    crashed = env.step(0)  # the third call raises
    np.testing.assert_array_equal(crashed[0], obs)
    assert crashed[1:] == (0.0, False, True, {"env_restarted": True}) and env.restarts == 1
    first, _ = env.reset()  # what the vector env's autoreset does next
    np.testing.assert_array_equal(first, np.zeros(3, np.float32))
    assert env.step(0)[0][0] == np.float32(0.01)


class NaNEnv(FlakyEnv):
    """Returns a NaN observation at its `bad_step`-th step, while `NaNEnv.broken` is set."""
    broken = True

    def __init__(self, bad_step: int = 30):
        super().__init__(every=10**9)
        self.bad_step, self.steps = bad_step, 0

    def step(self, action):
        obs, *rest = super().step(action)
        self.steps += 1
        if NaNEnv.broken and self.steps == self.bad_step:
            obs = np.full(3, np.nan, np.float32)
        return (obs, *rest)


def make_nan():
    return NaNEnv()


def test_a_nan_observation_stops_the_run_with_a_checkpoint_to_resume_from(tmp_path):
    cfg = _cfg(tmp_path, env={"id": "test_reliability:make_nan"}, run={"steps": 60})
    tr = Trainer(cfg)
    NaNEnv.broken = True
    try:
        with pytest.raises(EnvError, match=r"the observation contains NaN or Inf.*\(at 30 env "
                                           r"steps\); stopped with a checkpoint.*--resume"):
            tr.run()
    finally:
        NaNEnv.broken = False
        tr.close()
    payload, _ = load_latest(tmp_path)
    assert payload["counters"]["env_steps"] == 30 and payload["counters"]["updates"] > 0
    again = Trainer(make_config("default", run={"steps": 60}), tmp_path, resume=True)
    assert again.counters["env_steps"] == 30 and again.replay.count == 30
    assert np.isfinite(again.replay.data["obs/vector"][:30]).all()  # none of the bad step
    again.run()
    again.close()
    assert again.counters["env_steps"] == 60


def test_train_releases_the_run_directory_when_the_run_fails(tmp_path):
    """lucid.train.train closes its Trainer also when the run raises: the run resumes in the
    same process while the error (and its traceback) is still at hand."""
    from lucid.train import train
    cfg = _cfg(tmp_path, env={"id": "test_reliability:make_nan"}, train={"prefill": 10**6},
               run={"steps": 60})
    NaNEnv.broken = True
    try:
        with pytest.raises(EnvError, match="NaN") as err:
            train(cfg)
    finally:
        NaNEnv.broken = False
    again = Trainer(make_config("default", run={"steps": 40}), tmp_path, resume=True)
    again.close()
    assert again.counters["env_steps"] == 30 and err.value.__traceback__ is not None


def test_an_env_without_render_mode_names_what_videos_need():
    from lucid.envs import make_env
    make_env("test_reliability:FlakyEnv").close()  # training needs no render_mode
    with pytest.raises(TypeError, match="does not take render_mode, which videos need"):
        make_env("test_reliability:FlakyEnv", render_mode="rgb_array")


def test_an_env_whose_close_raises_costs_a_warning_not_the_run(tmp_path):
    """Its close() stopped the start (the start-up check closes the env it stepped), cost
    every evaluation its returns, and left the run directory locked in this process
    (Trainer.close raised before releasing it)."""
    from lucid import LucidWarning
    cfg = _cfg(tmp_path, env={"id": "envs_for_tests:CloseRaisesEnv"},
               run={"steps": 40, "eval_every": 30, "eval_episodes": 1})
    with pytest.warns(LucidWarning, match=r"CloseRaisesEnv's close\(\) raised RuntimeError: "
                                          r"no close; lucid goes on"):
        tr = Trainer(cfg)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        tr.run()
        tr.close()
        assert tr.closed
        Trainer(make_config("default", run={"steps": 50}), tmp_path, resume=True).close()
    evals = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert any(e["eval"] for e in evals)


def test_an_env_whose_reset_takes_no_seed_is_named_at_once(tmp_path):
    """It was rebuilt env.max_restarts times, each reset failing on the seed, before the
    run stopped (a traceback from `lucid train`)."""
    cfg = _cfg(tmp_path / "run", env={"id": "envs_for_tests:OldResetEnv"})
    with pytest.raises(TypeError, match=r"reset\(\) takes no seed: gymnasium envs define "
                                        r"`def reset\(self, \*, seed=None, options=None\)`"):
        Trainer(cfg)
    assert not (tmp_path / "run").exists()


def test_an_env_whose_render_returns_nothing_is_named_where_videos_fail():
    """Was "'NoneType' object is not subscriptable" (lucid eval --video, the run's videos)."""
    from lucid import Dreamer
    from lucid.video import record_episodes
    agent = Dreamer("envs_for_tests:RenderNoneEnv", preset="cpu-control", size="nano",
                    run__device="cpu")
    with pytest.raises(TypeError, match=r"render\(\) returned None, not an H x W \(x C\) "
                                        r"frame"):
        record_episodes(agent.agent, "envs_for_tests:RenderNoneEnv", 1, max_steps=10)


@pytest.mark.parametrize("mistake,message", [
    ("reset_shape", r"first observation does not fit its observation_space.*the observation "
                    r"has shape \(3,\), expected \(2,\)"),
    ("reset_without_info", r"reset\(\) returned ndarray, not \(observation, info\)"),
    ("reset_info_none", r"reset\(\) returned \(observation, NoneType\); its info must be a "
                        r"dict"),
    ("four_tuple", r"step\(\) returned tuple of 4"),
    ("vector_reward", "returned the reward array.*it must be one real number"),
    # gymnasium's vector env fails on these only once the run has started: float() of a
    # complex, and None.items()
    ("complex_reward", r"returned the reward \(1\+1j\); it must be one real number"),
    ("info_none", r"step\(\) returned the info None; it must be a dict"),
    ("terminated_none", "terminated=None.*must be bools"),
    ("terminated_two", "terminated=2, truncated=False; both must be bools"),
    ("step_shape", r"observation after step\(\) does not fit its observation_space.*shape "
                   r"\(3,\), expected \(2,\)"),
])
def test_a_custom_envs_mistakes_are_named_before_anything_is_written(tmp_path, mistake, message):
    cfg = _cfg(tmp_path / "run", env={"id": "envs_for_tests:BrokenEnv",
                                      "kwargs": {"mistake": mistake}})
    with pytest.raises((TypeError, ValueError), match=message):
        Trainer(cfg)
    assert not (tmp_path / "run").exists()


def test_a_bool_reward_is_a_reward_of_0_or_1(tmp_path):
    """gymnasium's env checker takes a Python bool as the reward (an int): so does lucid,
    as 0 or 1 (it was refused as not a number)."""
    with Trainer(_cfg(tmp_path, env={"id": "envs_for_tests:BrokenEnv",
                                     "kwargs": {"mistake": "bool_reward"}},
                      run={"steps": 40})) as tr:
        tr.run()
    eps = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert eps and {e["return"] for e in eps if not e["eval"]} == {2.0}  # True at steps 2, 4


@pytest.mark.parametrize("mistake,message", [
    ("shape", r"observation 'b' has shape \(4,\), expected \(3,\)"),
    ("missing_key", r"observation is missing key 'b' \(has \['cam'\]\)"),
    ("dtype", r"observation 'cam' is float64, which its space's dtype uint8 cannot hold: "
              r"return it as uint8"),
])
def test_an_observation_that_stops_fitting_its_space_is_named_by_its_key(tmp_path, mistake,
                                                                        message):
    """gymnasium's vector env refuses such observations in numpy's words ('Output array is
    the wrong shape', 'Cannot cast array data'), or as a bare KeyError: 'b'; the run names
    the key, at the start before any file is written, and later with a checkpoint."""
    first = _cfg(tmp_path / "first", env={"id": "envs_for_tests:LaterBrokenEnv",
                                          "kwargs": {"mistake": mistake, "at": 0}})
    with pytest.raises((ValueError, KeyError), match=message):
        Trainer(first)
    assert not (tmp_path / "first").exists()
    cfg = _cfg(tmp_path / "later", env={"id": "envs_for_tests:LaterBrokenEnv",
                                        "kwargs": {"mistake": mistake, "at": 3}},
               run={"steps": 100})
    tr = Trainer(cfg)
    with pytest.raises(EnvError, match=message + r".*\(at 2 env steps\); stopped with a "
                                                  r"checkpoint") as err:
        tr.run()
    tr.close()
    assert "\"" not in str(err.value).split(";")[0]  # a message, not a quoted KeyError
    assert list_checkpoints(tmp_path / "later")


def test_a_start_that_fails_after_making_its_directory_takes_it_away(tmp_path, monkeypatch):
    """An env that passes the start-up check but whose training copy cannot be built: the
    directory the start made (holding only its config.yaml) goes again, so failed starts do
    not pile up under runs/; a directory the user made is kept."""
    import envs_for_tests
    monkeypatch.chdir(tmp_path)
    env = {"id": "envs_for_tests:OneInstanceEnv"}
    for run_dir in (None, tmp_path / "made" / "run", tmp_path / "mine"):
        if run_dir == tmp_path / "mine":
            run_dir.mkdir()
        monkeypatch.setattr(envs_for_tests.OneInstanceEnv, "made", 0)
        with pytest.raises(Exception, match="one instance per process"):
            Trainer(_cfg(run_dir, env=env, run={"run_dir": run_dir and str(run_dir)}))
    assert list((tmp_path / "runs").iterdir()) == []
    assert not (tmp_path / "made" / "run").exists()
    assert (tmp_path / "mine").is_dir()  # the user's, with the config.yaml a retry replaces
    # a memory-mapped replay's ring files, made before the envs, go with the directory
    monkeypatch.setattr(envs_for_tests.OneInstanceEnv, "made", 0)
    with pytest.raises(Exception, match="one instance per process"):
        Trainer(_cfg(tmp_path / "mm", env=env, train={"replay_memmap": True}))
    assert not (tmp_path / "mm").exists()
    # and another data-parallel rank's (replay-rank1/ring/), made while this rank failed
    rank1 = tmp_path / "mm2" / "replay-rank1" / "ring"
    real_init = envs_for_tests.OneInstanceEnv.__init__

    def init(self):
        if envs_for_tests.OneInstanceEnv.made:  # the training copy: rank 1 attached by now
            rank1.mkdir(parents=True, exist_ok=True)
            np.save(rank1 / "obs__vector.npy", np.zeros(3))
        real_init(self)
    monkeypatch.setattr(envs_for_tests.OneInstanceEnv, "__init__", init)
    monkeypatch.setattr(envs_for_tests.OneInstanceEnv, "made", 0)
    with pytest.raises(Exception, match="one instance per process"):
        Trainer(_cfg(tmp_path / "mm2", env=env, train={"replay_memmap": True}))
    assert not (tmp_path / "mm2").exists()
    monkeypatch.setattr(envs_for_tests.OneInstanceEnv, "__init__", real_init)
    monkeypatch.setattr(envs_for_tests.OneInstanceEnv, "made", -5)  # builds from now on
    tr = Trainer(_cfg(tmp_path / "mine", env=env))
    tr.close()


def test_a_resume_with_another_train_ratio_goes_on_from_the_updates_done(tmp_path, said):
    """train.train_ratio raised in config.yaml before a resume: the updates go on at the new
    ratio from the updates done (not a burst of the updates the whole run would have had)."""
    import re
    tr = Trainer(_cfg(tmp_path))
    tr.run()
    tr.close()
    done = tr.counters["updates"]
    assert done == (60 - 20) * 16 // 16  # (env steps - prefill) * ratio / (B * T)
    path = tmp_path / "config.yaml"
    text, n = re.subn(r"train_ratio: 16(\.0)?\b", "train_ratio: 64", path.read_text())
    assert n == 1
    path.write_text(text)
    again = Trainer(make_config("default", run={"steps": 70}), tmp_path, resume=True)
    assert again.updates_due() == done  # not (60 - 20) * 64 / 16 = 160
    assert "train schedule changed on resume (train_ratio 16 -> 64" in said()
    again.run()
    again.close()
    assert again.counters["updates"] == done + (70 - 60) * 64 // 16
    third = Trainer(make_config("default", run={"steps": 70}), tmp_path, resume=True)
    assert third.updates_due() == third.counters["updates"]  # the offset is saved
    assert "train schedule changed" not in said()
    third.close()
    path.write_text(path.read_text().replace("train_ratio: 64", "train_ratio: 32"))
    fourth = Trainer(make_config("default", run={"steps": 70}), tmp_path, resume=True)
    assert fourth.updates_due() == fourth.counters["updates"]  # a second change: the same
    assert "train schedule changed on resume (train_ratio 64 -> 32" in said()
    fourth.close()


def test_a_replay_too_small_for_one_window_is_refused_before_the_run(tmp_path):
    """train.replay_max_gb can cap the replay below train.batch_length steps per env: no
    update could ever run, so the start says which settings to change."""
    step = 4 * 4 + 2 * 4 + 4 + 3  # CartPole: 4 floats, 2 actions, reward, 3 flags
    cfg = _cfg(tmp_path, env={"num_envs": 2}, train={"replay_max_gb": (12 * step + 0.5) / 2**30})
    with pytest.raises(ConfigError, match=r"keeps 6 steps per env stream .*replay_max_gb.*"
                                          r"env.num_envs=2\), fewer than train.batch_length=8"
                                          r".*raise train.replay_capacity"):
        Trainer(cfg)


def test_a_start_that_loses_the_lock_leaves_the_winners_directory_alone(tmp_path, monkeypatch):
    """Two starts on the same new --run-dir: both find it missing, the other one makes and
    locks it first; the refused start must not take away what it did not make."""
    import lucid.rundir
    real, other = lucid.rundir.claim_run_dir, []

    def other_claims_first(given, cfg):
        monkeypatch.setattr(lucid.rundir, "claim_run_dir", real)
        other.append(Trainer(_cfg(given)))
        return real(given, cfg)

    monkeypatch.setattr(lucid.rundir, "claim_run_dir", other_claims_first)
    with pytest.raises(ConfigError, match="in use by another Trainer"):
        Trainer(_cfg(tmp_path / "run"))
    assert (tmp_path / "run" / "config.yaml").is_file()
    other[0].run()
    other[0].close()
    assert list_checkpoints(tmp_path / "run")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_repeated_sigterm_finishes_the_step_and_a_second_ctrl_c_stops_at_once(tmp_path,
                                                                               signum):
    """Both signals arrive twice at once at an episode's end (as `timeout make train` sends
    SIGTERM to make and to the run, and make passes it on). SIGTERM: the run ends as after
    one, at its step's end, saved, `signalled` set for `lucid train`'s exit status. SIGINT: the
    second one means stop now; the run still saves before KeyboardInterrupt leaves it."""
    tr = Trainer(_cfg(tmp_path, run={"steps": 10_000}))
    handler = signal.getsignal(signum)

    def twice(info):
        if info["env_steps"] >= 40:
            os.kill(os.getpid(), signum)
            os.kill(os.getpid(), signum)

    try:
        if signum == signal.SIGINT:
            with pytest.raises(KeyboardInterrupt):
                tr.run(callback=twice)
        else:
            tr.run(callback=twice)
            assert tr.signalled == signal.SIGTERM
        assert 40 <= tr.counters["env_steps"] < 200
        assert load_latest(tmp_path)[0]["counters"]["env_steps"] == tr.counters["env_steps"]
    finally:
        tr.close()
    assert signal.getsignal(signum) is handler  # the handlers are put back


def test_a_run_whose_episodes_never_end_says_so_once(tmp_path, monkeypatch, said):
    import lucid.notes
    monkeypatch.setattr(lucid.notes, "NO_EPISODE_STEPS", 40)
    cfg = _cfg(tmp_path, env={"id": "envs_for_tests:CountEnv", "kwargs": {"terminate": False}},
               run={"steps": 80})
    tr = Trainer(cfg)
    tr.run()
    tr.close()
    out = said()
    assert out.count("note: no episode has ended in 40 env steps; if this env has no time "
                     "limit, give it one (env.max_episode_steps=N)") == 1
    ends = _cfg(tmp_path / "ends", env={"id": "envs_for_tests:CountEnv"}, run={"steps": 80})
    tr = Trainer(ends)  # CountEnv ends every 3 steps: nothing to say
    tr.run()
    tr.close()
    assert "no episode has ended" not in said()


def test_eval_and_callback_failures_keep_the_run(tmp_path, monkeypatch):
    """An env that never ends an episode stops evaluating with a warning (no hang); a
    failing evaluation costs the evaluation only; a raising callback leaves a checkpoint."""
    import lucid.runner
    monkeypatch.setattr(lucid.runner, "EVAL_MAX_STEPS", 50)
    cfg = _cfg(tmp_path, env={"id": "envs_for_tests:CountEnv", "kwargs": {"terminate": False},
                              "max_episode_steps": 30})
    tr = Trainer(cfg)
    tr.cfg.env.max_episode_steps = None  # evaluation envs without a time limit
    with pytest.warns(UserWarning, match="episodes do not end; the rest are cut .*time limit"):
        cut = tr.evaluate(2)  # the running episode, with its return so far (reward = step)
    assert [(e.ret, e.length) for e in cut] == [(sum(range(1, 51)), 50)]  # EVAL_MAX_STEPS
    tr.cfg.env.id = "no_such_module:Env"  # evaluation fails; training goes on
    tr.cfg.run.eval_every = 25
    with pytest.warns(UserWarning, match="evaluation at .* env steps failed"):
        tr.run()
    assert tr.counters["env_steps"] == 60

    def callback(info):
        raise RuntimeError("a bug in the user's callback")
    tr.cfg.run.steps, tr.cfg.run.eval_every = 200, 0
    with pytest.raises(RuntimeError, match="user's callback"):
        tr.run(callback)
    tr.close()
    payload, _ = load_latest(tmp_path)
    assert payload["counters"]["env_steps"] == tr.counters["env_steps"] > 60


def test_one_training_process_per_run_directory_and_loading_one_changes_nothing(tmp_path):
    from lucid.parts import VIEW_STEPS
    tr = Trainer(_cfg(tmp_path, train={"replay_memmap": True}, run={"steps": 30}))
    tr.run()  # a Trainer that learns holds its directory from its start until close()
    files = lambda: {p: p.read_bytes() for p in tmp_path.rglob("*")  # noqa: E731
                     if p.is_file() and p.name != ".lock"}  # (.lock holds the holder's pid)
    before = files()
    # a second training Trainer of the same run: refused before it opens anything (its
    # memory-mapped replay ring would have truncated the live run's)
    with pytest.raises(ConfigError, match=r"in use by another Trainer or Dreamer of this "
                                          r"process.*close\(\) it"):
        Trainer(make_config("default", run={"steps": 60}), tmp_path, resume=True)
    assert files() == before
    tr.close()
    # e.g. a second `lucid train --resume` while the first one trains
    holder = popen_grouped(
        [sys.executable, "-c", "import sys; from lucid.checkpoint import RunLock; "
         f"lock = RunLock({str(tmp_path)!r}); lock.acquire(); print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=rf"in use: another lucid process \(pid "
                                              rf"{holder.pid}\)"):
            Trainer(make_config("default", run={"steps": 60}), tmp_path, resume=True)
    finally:
        try:
            holder.communicate("", timeout=60)
        finally:
            kill_group(holder)
    assert files() == before
    # eval and dream load it without the lock, into memory, and write nothing
    view = load_to_act(tmp_path)
    assert not isinstance(view.replay.data["obs/vector"], np.memmap)
    assert view.replay.per_env == VIEW_STEPS < tr.replay.per_env
    for k, v in _stored(view.replay).items():
        np.testing.assert_array_equal(v, _stored(tr.replay)[k])
    assert files() == before
    again = Trainer(make_config("default", run={"steps": 60}), tmp_path, resume=True)
    again.run()
    again.close()
    assert again.counters["env_steps"] == 60


def test_loading_a_run_to_evaluate_sets_nothing_aside(tmp_path):
    """learn=False (eval, dream; maybe while the run trains): a corrupt newest checkpoint
    and replay chunk are skipped, not renamed, and a chunk being written (.tmp) stays, also
    where config.yaml is empty and the config comes from the checkpoint."""
    with Trainer(_cfg(tmp_path, train={"prefill": 10**6, "replay_chunk": 8},
                      run={"steps": 30})) as tr:
        tr.run()
    good = list_checkpoints(tmp_path)[-1]
    (good.parent / "ckpt-000000999.pt").write_bytes(good.read_bytes()[:100])  # cut short
    (tmp_path / "replay" / "chunk-000000900-000000908.npz").write_bytes(b"torn")
    (tmp_path / "replay" / "chunk-000000015-000000020.npz.tmp").write_bytes(b"in flight")
    files = lambda: {p: p.read_bytes() for p in tmp_path.rglob("*")  # noqa: E731
                     if p.is_file() and p.name != ".lock"}
    before = files()
    for config in (before[tmp_path / "config.yaml"], b""):
        (tmp_path / "config.yaml").write_bytes(config)
        with pytest.warns(UserWarning, match="ckpt-000000999.pt"):
            view = load_to_act(tmp_path)
        view.close()
        assert view.counters["env_steps"] == 30 and len(view.replay) == 30
        assert files() == {**before, tmp_path / "config.yaml": config}


def test_resume_sets_aside_a_corrupt_checkpoint_and_drops_logs_past_the_checkpoint(tmp_path):
    tr = Trainer(_cfg(tmp_path, run={"steps": 40, "keep_checkpoints": 1}))
    tr.run()
    tr.close()
    good = list_checkpoints(tmp_path)[-1]
    (good.parent / "ckpt-000000999.pt").write_bytes(good.read_bytes()[:100])  # cut short
    for name in ("episodes.jsonl", "metrics.jsonl"):  # rows a killed run wrote later
        with open(tmp_path / name, "a") as f:
            f.write(json.dumps({"env_steps": 55, "lost": True}) + "\n" + '{"env_st')
    videos = tmp_path / "videos"  # and videos it made later: moved out of the report
    videos.mkdir(exist_ok=True)
    (videos / "superseded").mkdir()  # one set aside by an earlier resume stays
    (videos / "superseded" / "eval-000000055.mp4").write_bytes(b"earlier")
    for name in ("eval-000000040.mp4", "eval-000000055.mp4", "dream-000000055.png", "mine.gif",
                 "eval-2024-notes.mp4"):  # the last is the user's: no step of lucid's
        (videos / name).write_bytes(name.encode())
    with pytest.warns(UserWarning, match="set aside as ckpt-000000999.pt.corrupt"):
        again = Trainer(make_config("default", run={"steps": 60}), tmp_path, resume=True)
    again.run()
    again.close()
    assert sorted(p.name for p in videos.iterdir()) == [
        "eval-000000040.mp4", "eval-2024-notes.mp4", "mine.gif", "superseded"]
    assert {p.name: p.read_text() for p in (videos / "superseded").iterdir()} == {
        "eval-000000055.mp4": "earlier", "eval-000000055.1.mp4": "eval-000000055.mp4",
        "dream-000000055.png": "dream-000000055.png"}
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == [list_checkpoints(tmp_path)[-1].name, "ckpt-000000999.pt.corrupt"]
    assert load_latest(tmp_path)[0]["counters"]["env_steps"] == 60  # the new one was kept
    for name in ("episodes.jsonl", "metrics.jsonl"):
        rows = [json.loads(line) for line in open(tmp_path / name)]
        assert not any("lost" in row for row in rows), name
        steps = [row["env_steps"] for row in rows]
        assert steps == sorted(steps), name  # the curve never runs back
    assert json.loads(open(tmp_path / "metrics.jsonl").readlines()[-1])["env_steps"] == 60


def test_videos_past_the_resume_step_move_aside_without_overwriting_any_moved_before(tmp_path):
    """set_aside_videos_after(run, 40): a video of step 40 stays, one of step 41 moves; a
    name taken twice in superseded/ gets the next free number (.2 after .1)."""
    from lucid.video import set_aside_videos_after, video_step
    videos = tmp_path / "videos"
    (videos / "superseded").mkdir(parents=True)
    for name in ("eval-000000041.mp4", "eval-000000041.1.mp4"):  # two earlier resumes
        (videos / "superseded" / name).write_text("earlier " + name)
    for name in ("eval-000000040.mp4", "eval-000000041.mp4", "dream-000000041-2.mp4"):
        (videos / name).write_text(name)
    assert video_step("dream-000000041-2.mp4") == 41 and video_step("eval-41.mp4") is None
    moved = set_aside_videos_after(tmp_path, 40)
    assert sorted(p.name for p in moved) == ["dream-000000041-2.mp4", "eval-000000041.2.mp4"]
    assert sorted(p.name for p in videos.iterdir()) == ["eval-000000040.mp4", "superseded"]
    assert {p.name: p.read_text() for p in (videos / "superseded").iterdir()} == {
        "eval-000000041.mp4": "earlier eval-000000041.mp4",
        "eval-000000041.1.mp4": "earlier eval-000000041.1.mp4",
        "eval-000000041.2.mp4": "eval-000000041.mp4",
        "dream-000000041-2.mp4": "dream-000000041-2.mp4"}
    assert set_aside_videos_after(tmp_path, 41) == []


# --------------------------------------------------------------------------- run directories

def test_a_new_run_never_writes_into_another_runs_directory(tmp_path, monkeypatch):
    tr = Trainer(_cfg(tmp_path, run={"steps": 30}))
    tr.run()
    tr.close()
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match=r"already holds a run \(checkpoints, replay, "
                                          r"metrics.jsonl, episodes.jsonl\).*--resume"):
        Trainer(_cfg(tmp_path, run={"steps": 30}))
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    Trainer(_cfg(tmp_path / "empty", run={"steps": 30})).close()  # a new directory is fine
    young = tmp_path / "young"  # killed before its first checkpoint: logs, no checkpoint
    young.mkdir()
    (young / "metrics.jsonl").write_text('{"env_steps": 10}\n')
    (young / "config.yaml").write_text("run: {}\n")
    with pytest.raises(ConfigError, match=r"young holds the files \(metrics.jsonl\) of a run "
                                          r"that stopped before its first checkpoint.*delete"):
        Trainer(_cfg(young, run={"steps": 30}))  # not "--resume", which has nothing to load
    stranger = tmp_path / "stranger"  # no run: some other program's metrics.jsonl
    stranger.mkdir()
    (stranger / "metrics.jsonl").write_text('{"loss": 1}\n')
    with pytest.raises(ConfigError, match=r"stranger holds metrics.jsonl but no config.yaml, "
                                          r"so it is no lucid run") as refused:
        Trainer(_cfg(stranger, run={"steps": 30}))
    assert "delete" not in str(refused.value)
    assert [p.name for p in stranger.iterdir()] == ["metrics.jsonl"]
    failed = tmp_path / "failed"  # a start that failed after writing its config.yaml
    failed.mkdir()
    (failed / "config.yaml").write_text("run: {}\n")
    Trainer(_cfg(failed, run={"steps": 30})).close()
    assert "steps: 30" in (failed / "config.yaml").read_text()
    # another program's config.yaml (`--run-dir .` in a project that has one) is not
    # overwritten: it used to be, at once
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.yaml").write_text("database:\n  password: hunter2\n")
    with pytest.raises(ConfigError, match=r"project has a config.yaml that is not a lucid "
                                          r"run's.*give another run directory"):
        Trainer(_cfg(project, run={"steps": 30}))
    assert [p.name for p in project.iterdir()] == ["config.yaml"]
    assert "hunter2" in (project / "config.yaml").read_text()
    # default directories: two runs started in the same second get two directories
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("time.strftime", lambda fmt: "20261201-000000")
    cfg = _cfg(tmp_path, run={"run_dir": None})
    first, second = Trainer(cfg), Trainer(cfg)
    first.close(), second.close()
    assert first.run_dir == Path("runs/CartPole-v1-20261201-000000-s0")
    assert second.run_dir == Path("runs/CartPole-v1-20261201-000000-s0-2")


def test_a_run_directory_given_with_a_tilde_is_in_the_home_directory(tmp_path, monkeypatch):
    """run.run_dir=~/runs/x (or --run-dir=~/x) reaches lucid with its ~, which no shell
    expanded: the run went to a directory named ~ in the working directory."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    with Trainer(_cfg(tmp_path, run={"run_dir": "~/runs/x", "steps": 30})) as tr:
        tr.run()
    assert tr.run_dir == tmp_path / "home" / "runs" / "x" and not (tmp_path / "~").exists()
    again = load_to_act("~/runs/x")
    assert again.counters["env_steps"] == 30


def test_a_damaged_config_yaml_is_named_or_recovered_from_the_checkpoint(tmp_path, said):
    tr = Trainer(_cfg(tmp_path, run={"steps": 30}))
    tr.run()
    tr.close()
    path = tmp_path / "config.yaml"
    good = path.read_text()
    path.write_text(good.replace("batch_size: 2", "batch_size: [2"))  # a hand edit gone wrong
    with pytest.raises(ConfigError, match=r"config.yaml is not valid YAML .*line"):
        Trainer(make_config("default", run={"steps": 40}), tmp_path, resume=True)
    path.write_text("")  # a disk that filled up
    again = Trainer(make_config("default", run={"steps": 40}), tmp_path, resume=True)
    assert "config.yaml is empty; using the config stored in" in said()
    assert again.cfg.train.batch_size == 2 and again.counters["env_steps"] == 30
    again.close()
    assert path.read_text() == good.replace("steps: 30", "steps: 40")  # written back whole
    # edits of what the checkpoint and replay were made for are named, all of them, and
    # refused before anything is written; edits of other keys are taken
    edited = good.replace("num_envs: 1", "num_envs: 2").replace("size: nano", "size: XS")
    assert edited.count("num_envs: 2") == 1 and "size: XS" in edited
    path.write_text(edited)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match=r"env.num_envs: 1 in the checkpoint, 2 in config.yaml"
                                          r".*model.size: 'nano' in the checkpoint, 'XS'"):
        Trainer(make_config("default", run={"steps": 40}), tmp_path, resume=True)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    path.write_text(good.replace("train_ratio: 16", "train_ratio: 32"))
    again = Trainer(make_config("default", run={"steps": 40}), tmp_path, resume=True)
    assert again.cfg.train.train_ratio == 32
    again.close()
    with pytest.raises(FileNotFoundError, match="not a lucid run"):
        Trainer(make_config("default"), tmp_path / "nothing", resume=True)


def test_a_full_disk_stops_the_run_at_its_last_checkpoint_with_the_fix_named(tmp_path):
    from typer.testing import CliRunner
    from lucid.cli import app
    ref = Trainer(_cfg(tmp_path / "ref", run={"steps": 60}))  # the name of the 60-step save
    ref.run()
    ref.close()
    final = list_checkpoints(tmp_path / "ref")[-1].name
    run = tmp_path / "run"
    tr = Trainer(_cfg(run, run={"steps": 30}))
    tr.run()
    tr.close()
    first = list_checkpoints(run)
    tmp = run / "checkpoints" / (final + ".tmp")
    # the checkpoint's temporary file is /dev/full: every write to it fails with ENOSPC
    tmp.symlink_to("/dev/full")
    again = Trainer(make_config("default", run={"steps": 60}), run, resume=True)
    with pytest.raises(DiskFullError, match=rf"the disk under {run} is full \(No space left "
                                            rf"on device writing {tmp.with_suffix('')}, at 60 env steps\); "
                                            rf".*{first[-1].name}.*intact.*"
                                            rf"--resume {run}"):
        again.run()
    again.close()
    assert list_checkpoints(run) == first and not os.path.lexists(tmp)  # its space is freed
    tmp.symlink_to("/dev/full")
    r = CliRunner().invoke(app, ["train", "--resume", str(run), "--steps", "60"])
    assert r.exit_code == 2 and "is full" in r.output and "Traceback" not in r.output
    resumed = Trainer(make_config("default", run={"steps": 60}), run, resume=True)  # space again
    assert resumed.counters["env_steps"] == 30
    resumed.run()
    resumed.close()
    assert list_checkpoints(run)[-1].name == final
    # a full disk under any other command is one line too, naming the file
    (tmp_path / "r.html.tmp").symlink_to("/dev/full")
    r = run_grouped([sys.executable, "-m", "lucid", "report", str(run), "--out",
                     str(tmp_path / "r.html")], timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"no space left on the disk ({tmp_path / 'r.html'})" in r.stderr


# --------------------------------------------------------------------------- config

@pytest.mark.parametrize("override,key", [
    ("train.horizon=0", "train.horizon"), ("train.gamma=1.5", "train.gamma"),
    ("train.replay_capacity=4", "train.replay_capacity"), ("run.device=tpu", "run.device"),
    ("train.continuous_grad=magic", "continuous_grad"), ("model.unimix=1.0", "model.unimix"),
    ("env.num_envs=0", "env.num_envs"), ("train.max_nonfinite=0", "max_nonfinite"),
    ("run.eval_every=-1", "run.eval_every"), ("run.time_limit=-1", "run.time_limit"),
    ("run.threads=-2", "run.threads"), ("env.max_episode_steps=0", "env.max_episode_steps"),
    ("model.dense_units=-1", "model sizes"), ("model.bins_low=30", "model.bins_low"),
    ("env.kwargs.render_mode=human", "env.kwargs.render_mode"),
    ("env.kwargs.max_episode_steps=9", "env.max_episode_steps instead"),
    # each at the first value past its bound
    ("train.batch_length=1", "train.batch_length >= 2"), ("train.gamma=0", "train.gamma"),
    ("train.lam=1.01", "train.lam"), ("train.train_ratio=0", "train.train_ratio"),
    ("train.replay_value_scale=-0.1", "train.replay_value_scale"),
    ("train.replay_value_grad=true", "set train.replay_value_scale"),
    ("train.actor_lr=-1e-5", "learning rates"), ("train.free_nats=-1", "train.free_nats"),
    ("train.rep_free_nats=-1", "train.rep_free_nats"), ("train.prefill=-1", "train.prefill"),
    ("train.replay_max_gb=-1", "train.replay_max_gb"),
    ("run.keep_checkpoints=0", "run.keep_checkpoints"), ("env.max_restarts=-1", "max_restarts"),
    ("run.runners=dask", "run.runners"), ("run.runner_chunk=0", "run.runner_chunk"),
    ("run.eval_episodes=0", "run.eval_episodes"), ("run.steps=-1", "run.steps"),
    ("model.num_bins=1", "model.num_bins"), ("model.actor_min_std=2", "model.actor_min_std"),
    ("model.action_clip=-1", "model.action_clip"),
    # values that trained on silently wrong (a clip < 0 flips the gradients, = 0 zeroes
    # them), or failed only once the run had started (a percentile past 100, an infinite
    # train ratio), or made every update non-finite (inf weights, rates or bins)
    ("train.model_clip=-1", "train.model_clip"), ("train.critic_clip=0", "train.critic_clip"),
    ("train.actor_eps=-1e-5", "train.actor_eps"),
    ("train.return_norm_high=150", "return_norm_high are percentiles"),
    ("train.return_norm_low=95", "0 <= low < high"), ("train.return_norm_low=-1", "percentiles"),
    ("train.return_norm_decay=1.01", "train.return_norm_decay"),
    ("train.slow_critic_fraction=-0.1", "train.slow_critic_fraction"),
    ("train.return_norm_min_scale=0", "train.return_norm_min_scale must be > 0"),
    ("train.entropy=-3e-4", "loss weights must be >= 0"), ("train.dyn_scale=-0.5", "dyn_scale"),
    ("train.train_ratio=inf", "train.train_ratio must be a finite number"),
    ("train.model_lr=inf", "train.model_lr must be a finite number"),
    ("train.reward_scale=nan", "train.reward_scale must be a finite number"),
    ("model.bins_high=inf", "model.bins_high must be a finite number"),
    ("train.actor_clip=nan", "train.actor_clip must be a finite number"),
    ("run.seed=-1", r"run.seed must be in \[0, 2\*\*31\)"), ("run.seed=2147483648", "run.seed"),
    # Ray's error at the first step, after the run had started, as if the env's fault
    ("run.runner_cpus=-1", "run.runner_cpus"), ("run.ray_num_cpus=-2", "run.ray_num_cpus"),
])
def test_impossible_values_are_refused_before_anything_runs(override, key):
    with pytest.raises(ConfigError, match=key):
        make_config("default", [override])


def test_a_clip_of_inf_is_no_clipping_and_every_preset_is_valid():
    assert make_config("default", ["train.model_clip=inf"]).train.model_clip == float("inf")
    for preset in PRESETS:
        make_config(preset)


@pytest.mark.parametrize("override,message", [
    ("=5", "override '=5' names no key"), ("train=5", "sets the whole train section"),
    ("env=[1]", "sets the whole env section; set one of its keys, env.KEY=value"),
    # was taken, and only relabeled the config: preset: dmc-vision over none of its values
    ("preset=dmc-vision", "would rename the preset, not apply it; choose it with --preset "
                          "dmc-vision"),
])
def test_an_override_without_a_key_or_of_a_whole_section_is_named(override, message):
    """Both were OmegaConf's words (Key '' not in 'Config' ... full_key:), or an
    AttributeError from lucid itself."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        make_config("default", [override])
    with pytest.raises(ConfigError, match="give each section a mapping of its keys"):
        make_config("default", train=5)  # what Python callers pass as a section


def test_a_config_yaml_with_an_impossible_value_is_refused_where_it_is_read():
    import yaml
    from lucid.config import from_yaml, to_yaml
    data = yaml.safe_load(to_yaml(make_config("default")))
    data["train"]["gamma"] = 1.5  # a hand edit of a run's config.yaml
    with pytest.raises(ConfigError, match=r"train.gamma=1.5.*, in runs/x/config.yaml: fix"):
        from_yaml(yaml.safe_dump(data), where="runs/x/config.yaml")


def test_a_config_yaml_with_a_value_of_another_type_or_an_unknown_key_names_it_and_the_file():
    """A hand edit that OmegaConf refuses: once called a version mismatch, in OmegaConf's
    multi-line words (full_key: ..., reference_type=...), without the file."""
    import yaml
    from lucid.config import from_yaml, to_yaml
    data = yaml.safe_load(to_yaml(make_config("default")))
    data["train"]["batch_size"] = "abc"
    with pytest.raises(ConfigError, match=r"^bad value for config key 'train.batch_size' in "
                                          r"runs/x/config.yaml: .*fix that value there$") as err:
        from_yaml(yaml.safe_dump(data), where="runs/x/config.yaml")
    assert "\n" not in str(err.value) and "version" not in str(err.value)
    data["train"]["batch_size"], data["train"]["train_ration"] = 16, 64
    with pytest.raises(ConfigError, match=r"runs/x/config.yaml has the key 'train.train_ration', "
                                          r"which this version does not know \(did you mean "
                                          r"'train.train_ratio'\?\); remove it") as err:
        from_yaml(yaml.safe_dump(data), where="runs/x/config.yaml")
    assert "\n" not in str(err.value)


# --------------------------------------------------------------------------- SIGKILL

def _train_cmd(run_dir, steps, resume=False):
    if resume:
        args = ["--resume", str(run_dir), "--steps", str(steps)]
    else:
        args = ["CartPole-v1", "--preset", "default", "--size", "nano", "--steps", str(steps),
                "--run-dir", str(run_dir), "train.batch_size=2", "train.batch_length=8",
                "train.horizon=3", "train.prefill=50", "train.train_ratio=16",
                "train.replay_chunk=40", "run.checkpoint_every=60", "run.progress=false",
                "run.log_every=0.5", "run.threads=1"]
    return [sys.executable, "-m", "lucid", "train", *args]


def _replay_on_disk(run_dir):
    rep = Replay(10**6, 1, {"obs/vector": ((4,), np.float32), "action": ((2,), np.float32),
                            "reward": ((), np.float32), "is_first": ((), bool),
                            "is_last": ((), bool), "is_terminal": ((), bool)},
                 directory=Path(run_dir) / "replay")
    rep.restore()
    return rep


def _wait_for_checkpoint(run_dir, proc, timeout=120):
    t0 = time.time()
    while not list_checkpoints(run_dir):
        assert proc.poll() is None, "training exited before its first checkpoint"
        assert time.time() - t0 < timeout
        time.sleep(0.05)


@pytest.fixture
def started():
    """The training processes a test starts (`_start`), killed when it ends, also on failure:
    each trains for 100,000 steps unless stopped."""
    procs = []
    yield procs
    for proc in procs:
        kill_group(proc)
        proc.wait(30)


def _start(started, run_dir, log, env, resume=True):
    with open(log, "w") as out:
        started.append(popen_grouped(_train_cmd(run_dir, 100_000, resume=resume), cwd=ROOT,
                                     env=env, stdout=out, stderr=subprocess.STDOUT))
    return started[-1]


def _wait_for_line(log, text, proc, timeout=120):
    t0 = time.time()
    while True:
        for line in Path(log).read_text().splitlines():
            if text in line:
                return line
        assert proc.poll() is None, Path(log).read_text()
        assert time.time() - t0 < timeout, Path(log).read_text()
        time.sleep(0.05)


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume(tmp_path, started):
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    rng = random.Random(0)
    history = []
    proc = _start(started, run_dir, tmp_path / "log0", env, resume=False)
    _wait_for_checkpoint(run_dir, proc)
    for i in range(6):
        time.sleep(rng.uniform(0.3, 2.5))
        if i == 5:  # the last kill lands in the middle of a checkpoint write
            proc.send_signal(signal.SIGINT)  # SIGINT saves a checkpoint and exits cleanly
            assert proc.wait(60) == 128 + signal.SIGINT  # saved, said so, exit status 130
            assert "interrupted at " in Path(tmp_path / "log5").read_text()
            proc = _start(started, run_dir, tmp_path / "log-torn",
                          {**env, "LUCID_TEST_KILL_IN_CHECKPOINT": "1"})
            assert proc.wait(120) == -signal.SIGKILL
            assert list((run_dir / "checkpoints").glob("*.tmp")), "no torn checkpoint left"
        else:
            proc.kill()
            proc.wait(30)
        payload, path = load_latest(run_dir)
        on_disk = _replay_on_disk(run_dir)
        # every chunk that reached the disk is restored, at least up to the checkpoint
        assert on_disk.count >= payload["replay_count"]
        history.append((payload["counters"]["env_steps"], payload["counters"]["updates"]))
        proc = _start(started, run_dir, tmp_path / f"log{i + 1}", env)
        line = _wait_for_line(tmp_path / f"log{i + 1}", "resumed from", proc)
        assert f"at {history[-1][0]} env steps, {history[-1][1]} updates" in line, line
        assert f"replay holds {on_disk.count} steps" in line, line
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)  # SIGTERM also saves and exits cleanly
    assert proc.wait(60) == 128 + signal.SIGTERM
    final, _ = load_latest(run_dir)
    history.append((final["counters"]["env_steps"], final["counters"]["updates"]))
    steps = [h[0] for h in history]
    assert steps == sorted(steps), history  # counters never go back
    assert history[-1][1] > history[0][1]  # and training went on across the kills
    rep = _replay_on_disk(run_dir)
    s = rep._ordered(0, rep.count)
    assert np.isfinite(s["obs/vector"]).all()
    assert s["is_first"][0, 0] and s["is_first"][0].sum() >= 7  # each resume starts an episode


def test_a_run_killed_in_its_first_minutes_can_be_resumed(tmp_path, started):
    """With the default checkpoint schedule (every run.checkpoint_minutes=10), the first
    checkpoint comes with the first updates: a SIGKILL soon after the start leaves a run
    that resumes, where before it left only replay files."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [a for a in _train_cmd(run_dir, 100_000) if a != "run.checkpoint_every=60"]
    with open(tmp_path / "log0", "w") as out:
        started.append(popen_grouped(cmd, cwd=ROOT, env=env, stdout=out,
                                     stderr=subprocess.STDOUT))
    t0 = time.time()
    _wait_for_checkpoint(run_dir, started[-1])
    assert time.time() - t0 < 60  # not checkpoint_minutes
    started[-1].kill()
    started[-1].wait(30)
    payload, _ = load_latest(run_dir)
    assert payload["counters"]["updates"] >= 1
    proc = _start(started, run_dir, tmp_path / "log1", env)
    _wait_for_line(tmp_path / "log1", "resumed from", proc)


def test_training_with_a_memory_mapped_replay_runs_and_resumes(tmp_path):
    tr = Trainer(_cfg(tmp_path, train={"replay_memmap": True}, run={"steps": 60}))
    tr.run()
    tr.close()
    assert isinstance(tr.replay.data["obs/vector"], np.memmap)
    assert (tmp_path / "replay" / "ring" / "obs__vector.npy").exists()
    stored = _stored(tr.replay)
    again = Trainer(make_config("default", run={"steps": 80}), tmp_path, resume=True)
    for k, v in _stored(again.replay).items():
        np.testing.assert_array_equal(v, stored[k])
    again.run()
    again.close()
    assert again.counters["env_steps"] == 80 and again.counters["updates"] > tr.counters["updates"]


def test_empty_files_of_a_start_that_wrote_nothing_do_not_hold_a_run(tmp_path):
    """A directory whose run files are empty (a start killed before its first row) holds no
    run: a new run may start there."""
    (tmp_path / "metrics.jsonl").write_text("")
    (tmp_path / "episodes.jsonl").write_text("")
    (tmp_path / "replay").mkdir()
    Trainer(_cfg(tmp_path)).close()
    assert (tmp_path / "config.yaml").is_file()


def test_a_resume_with_another_prefill_goes_on_from_the_updates_done(tmp_path, said):
    """train.prefill edited in config.yaml before a resume: lowered, no burst of the updates
    the lower prefill would have called for; raised past the steps done, random actions
    again up to it and no updates, then updates go on from those done."""
    with Trainer(_cfg(tmp_path)) as tr:  # prefill 20, 60 steps: (60 - 20) * 16 / 16 updates
        tr.run()
    done = tr.counters["updates"]
    assert done == 40
    path = tmp_path / "config.yaml"
    saved = path.read_text()
    assert saved.count("prefill: 20\n") == 1
    path.write_text(saved.replace("prefill: 20\n", "prefill: 0\n"))
    with Trainer(make_config("default", run={"steps": 64}), tmp_path, resume=True) as lower:
        assert lower.updates_due() == done  # not 60 * 16 / 16 = 60
        assert "(train_ratio 16 -> 16, prefill 20 -> 0," in said()
    path.write_text(saved.replace("prefill: 20\n", "prefill: 70\n"))
    with Trainer(make_config("default", run={"steps": 76}), tmp_path, resume=True) as higher:
        assert higher.updates_due() == 0
        higher.run()
    assert higher.counters["updates"] == done + (76 - 70) * 16 // 16


def test_a_restart_closes_the_env_it_replaces_and_a_reset_that_raises_is_retried():
    """A reset that raises rebuilds the env as a step that raises does; each env replaced is
    closed (it may hold a simulator); a step that raises right after a reset ends the episode
    at the observation of that reset."""
    from lucid.runner import Restarting
    made = []

    class Shaky(FlakyEnv):  # the 1st env's reset raises, the 2nd env's first step
        def __init__(self):
            super().__init__(every=10**9)
            self.closed = False
            made.append(self)

        def reset(self, *, seed=None, options=None):
            if len(made) == 1:
                raise RuntimeError("no display")
            super().reset(seed=seed)
            return np.full(3, 0.5, np.float32), {}

        def step(self, action):
            if len(made) == 2:
                raise RuntimeError("simulator crashed")
            return super().step(action)

        def close(self):
            self.closed = True

    env = Restarting(Shaky, max_restarts=3)
    first, _ = env.reset()
    np.testing.assert_array_equal(first, np.full(3, 0.5, np.float32))
    obs, reward, term, trunc, info = env.step(0)
    np.testing.assert_array_equal(obs, first)
    assert (reward, term, trunc, info) == (0.0, False, True, {"env_restarted": True})
    assert env.restarts == 2 and len(made) == 3
    assert made[0].closed and made[1].closed and not made[2].closed


def test_the_collector_counts_every_envs_restart_of_a_step():
    """Two envs that both raise in the same vector step are two restarts."""
    from lucid.envs import ActionSpec, ObsSpec
    from lucid.runner import Collector, restarting
    probe = FlakyEnv()
    col = Collector([restarting(make_broken, 10)] * 2, ObsSpec.from_space(probe.observation_space),
                    ActionSpec.from_space(probe.action_space))
    col.step(None)
    assert col.restarts == 2
    col.close()


def test_a_collector_names_the_key_of_a_first_observation_that_does_not_fit():
    """The vector env's reset fails in numpy's words; the collector names the key from the
    observation that Restarting kept (a run's start-up check names it earlier; a collector
    made by other code, e.g. an env runner, relies on this)."""
    from envs_for_tests import LaterBrokenEnv
    from lucid.envs import ActionSpec, ObsSpec
    from lucid.runner import Collector, restarting
    probe = LaterBrokenEnv()
    specs = ObsSpec.from_space(probe.observation_space), ActionSpec.from_space(probe.action_space)
    with pytest.raises(ValueError, match=r"observation 'b' has shape \(4,\), expected \(3,\)"):
        Collector([restarting(lambda: LaterBrokenEnv("shape", at=0), 0)] * 2, *specs)
