"""`train.prefetch`: batches sampled on a background thread (lucid.replay.Prefetcher).

The train ratio stays exact, every batch is a set of windows that exist in the replay, and a
sample taken while the main thread writes never holds a half-written step."""

import json
import math
import sys
import threading

import numpy as np
import pytest
import torch

from lucid.config import make_config
from lucid.replay import Prefetcher, Replay, ReplayGroup
from lucid.train import Trainer


def _cfg(tmp_path, ratio, steps, prefetch=True):
    return make_config("default", env={"id": "CartPole-v1", "num_envs": 2},
                       model={"size": "nano"},
                       train={"batch_size": 4, "batch_length": 16, "horizon": 5, "prefill": 20,
                              "replay_capacity": 10_000, "train_ratio": ratio,
                              "prefetch": prefetch},
                       run={"steps": steps, "log_every": 0.0, "progress": False,
                            "run_dir": str(tmp_path)})


def _find_window(replay: Replay, row: dict) -> bool:
    """Is this (T, ...) window of every field a contiguous window of one env's stream?
    (No eviction in these runs: the stream is slots 0..count-1.)"""
    obs = replay.data["obs/vector"][:, :replay.count]
    T = row["obs"]["vector"].shape[0]
    for e in range(replay.num_envs):
        for s in range(replay.count - T + 1):
            if np.array_equal(obs[e, s:s + T], row["obs"]["vector"]):
                return all(np.array_equal(replay.data[k][e, s:s + T], row[k])
                           for k in ("action", "reward", "is_first", "is_last", "is_terminal"))
    return False


@pytest.mark.parametrize("ratio,steps", [(32, 120), (256, 40)])
def test_prefetch_keeps_the_train_ratio_exact_and_batches_come_from_the_replay(
        tmp_path, ratio, steps):
    tr = Trainer(_cfg(tmp_path, ratio, steps))
    batches = []
    train_step = tr.agent.train_step

    def recording(batch):
        batches.append({"obs": {k: v.numpy().copy() for k, v in batch["obs"].items()},
                        **{k: v.numpy().copy() for k, v in batch.items() if k != "obs"}})
        return train_step(batch)

    tr.agent.train_step = recording
    with tr:
        tr.run()
    c = tr.counters
    expected = math.floor((c["env_steps"] - 20) * ratio / (4 * 16))
    assert c["updates"] == expected == len(batches) > 0
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert rows[-1]["updates"] == expected
    waits = [r["perf/batch_wait_ms"] for r in rows if "perf/batch_wait_ms" in r]
    assert waits and all(w >= 0 for w in waits)
    for batch in batches[:: max(1, len(batches) // 12)]:  # a dozen spread over the run
        assert batch["obs"]["vector"].shape == (4, 16, 4)
        for i in range(4):
            row = {"obs": {"vector": batch["obs"]["vector"][i]},
                   **{k: batch[k][i] for k in batch if k != "obs"}}
            assert _find_window(tr.replay, row)
    assert tr._batches._pool is None  # the thread was stopped


def test_without_prefetch_the_wait_is_logged_too(tmp_path):
    tr = Trainer(_cfg(tmp_path, 64, 60, prefetch=False))
    with tr:
        tr.run()
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert any("perf/batch_wait_ms" in r for r in rows)


def test_a_prefetching_run_samples_on_its_thread_and_saves_the_state_without_prefetch(tmp_path):
    """train.prefetch samples on the background thread; the batch drawn ahead when the run
    ends is not the run's yet: the checkpoint's sampling state is the one after the updates'
    batches, as a run without prefetching saves it (a resume draws that batch first)."""
    from lucid.checkpoint import load_latest
    saved = {}
    for prefetch in (False, True):
        run_dir = tmp_path / str(prefetch)
        cfg = _cfg(run_dir, 64, 48, prefetch=prefetch)
        cfg.train.prefill = 40  # more steps per env than a window at every draw (with exactly
        # one window per env, a draw takes nothing from the RNG)
        with Trainer(cfg) as tr:
            real, threads = tr.replay.sample, set()
            tr.replay.sample = lambda *a: (threads.add(threading.current_thread().name),
                                           real(*a))[1]
            tr.run()
        assert tr.counters["updates"] == 8
        assert threads == ({"lucid-prefetch_0"} if prefetch else {"MainThread"})
        saved[prefetch] = load_latest(run_dir)[0]["replay_rng"]
    assert saved[True] == saved[False]


def _counter_replay(per_env: int, num_envs: int = 3) -> Replay:
    fields = {"obs/x": ((8,), np.float32), "action": ((2,), np.float32),
              "reward": ((), np.float32), "is_first": ((), np.bool_),
              "is_last": ((), np.bool_), "is_terminal": ((), np.bool_)}
    return Replay(per_env * num_envs, num_envs, fields, seed=0)


def _step(replay: Replay, n: int) -> dict:
    """Every numeric field of step n holds n, so a step mixing two writes is detectable."""
    e = replay.num_envs
    return {"obs/x": np.full((e, 8), n, np.float32), "action": np.full((e, 2), n, np.float32),
            "reward": np.full(e, n, np.float32), "is_first": np.zeros(e, bool),
            "is_last": np.zeros(e, bool), "is_terminal": np.zeros(e, bool)}


def test_samples_never_see_a_half_written_step():
    """The main thread keeps adding steps to a small ring (slots are overwritten all the time)
    while the prefetch thread samples; with thread switches forced every microsecond, any
    unlocked sample would catch `add` between two fields. Every sampled step must be whole
    (all fields equal) and every window consecutive."""
    replay = _counter_replay(per_env=24)
    n = 0
    for _ in range(24):
        replay.add(_step(replay, n))
        n += 1
    pf = Prefetcher(replay, 8, 6, "cpu")
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(1500):
            batch = pf.get()
            for _ in range(3):
                replay.add(_step(replay, n))
                n += 1
            x = batch["obs"]["x"].numpy()
            ref = x[..., 0]
            assert (x == ref[..., None]).all()
            assert (batch["action"].numpy() == ref[..., None]).all()
            assert (batch["reward"].numpy() == ref).all()
            assert (np.diff(ref, axis=1) == 1).all()
    finally:
        sys.setswitchinterval(old)
        pf.close()


class _Gate(np.ndarray):
    """An array whose writes pause halfway through Replay.add: after the fields before it
    were written, it lets another thread run (`half`), waiting up to `wait` s for `done`."""

    def __setitem__(self, key, value):
        self.half.set()
        self.done.wait(self.wait)
        super().__setitem__(key, value)


def test_a_sample_waits_for_a_step_being_written():
    """Deterministic: `add` is stopped between two fields while another thread samples
    windows that cover every slot. With the replay's lock the sample waits for the whole step
    (the writer's wait times out first); without it, it would return the half-written one."""
    import threading
    replay = _counter_replay(per_env=6, num_envs=1)
    for n in range(6):
        replay.add(_step(replay, n))
    gate = replay.data["action"].view(_Gate)  # fields are written in order: obs/x first
    gate.half, gate.done, gate.wait = threading.Event(), threading.Event(), 0.5
    replay.data["action"] = gate
    out = {}

    def sampler():
        gate.half.wait(10)
        out["batch"] = replay.sample(4, 6)  # windows of the whole ring: every slot
        gate.done.set()

    thread = threading.Thread(target=sampler)
    thread.start()
    replay.add(_step(replay, 6))
    thread.join(10)
    batch = out["batch"]
    x = batch["obs/x"][..., 0]
    assert (batch["action"] == x[..., None]).all() and (batch["reward"] == x).all()
    assert (x == np.arange(1, 7)).all()  # the sample came after the write: steps 1..6


def test_a_reseeded_replay_group_gives_each_part_its_own_stream():
    """Data-parallel ranks reseed their group: every part draws its windows from a stream of
    its own (the same seed for all would pick matching windows in each part), the same
    streams again for the same seed."""
    parts = [_counter_replay(per_env=32, num_envs=2) for _ in range(3)]
    group = ReplayGroup(parts, seed=0)

    def draws():
        return [tuple(p.rng.integers(1 << 62, size=4)) for p in parts]

    group.reseed(np.random.SeedSequence(5).spawn(2)[1])
    first = draws()
    assert len(set(first)) == 3
    group.reseed(np.random.SeedSequence(5).spawn(2)[1])
    assert draws() == first


def test_prefetcher_over_a_replay_group_and_errors_reach_the_learner():
    parts = [_counter_replay(per_env=32, num_envs=2) for _ in range(2)]
    group = ReplayGroup(parts, seed=0)
    for i, p in enumerate(parts):
        steps = {k: np.stack([_step(p, 100 * i + j)[k] for j in range(20)], 1)
                 for k in p.data}
        group.add_chunk(i, steps)
    pf = Prefetcher(group, 5, 10, torch.device("cpu"))
    for _ in range(4):
        batch = pf.get()
        assert batch["obs"]["x"].shape == (5, 10, 8)
        assert (np.diff(batch["reward"].numpy(), axis=1) == 1).all()
    assert pf.wait_ms() >= 0 and pf.wait_ms() is None  # reset after reading
    pf.close()

    bad = Prefetcher(_counter_replay(per_env=32), 2, 10, "cpu")  # empty: cannot sample
    with pytest.raises(ValueError, match="fewer than the window"):
        bad.get()
    bad.close()


@pytest.mark.parametrize("group", [False, True])
def test_a_checkpoint_saves_the_rng_as_before_the_batch_in_flight(group):
    """The batch drawn ahead when a checkpoint is written is the first a resumed run draws:
    the saved state is the one before it (and for a group of Ray runners' replays, each
    part's state too)."""
    def replay(seed):
        parts = [Replay(200, 2, {"reward": ((), np.float32)}, seed=seed + i) for i in range(2)]
        for p in parts:
            p.add_chunk({"reward": np.arange(200, dtype=np.float32)[None].repeat(2, 0)})
        return ReplayGroup(parts, seed) if group else parts[0]

    live = replay(0)
    ahead = Prefetcher(live, 4, 8, "cpu")
    for _ in range(3):
        ahead.get()
    ahead._next.result()  # the 4th batch, drawn ahead: the thread has sampled it
    state = ahead.rng_state()
    fourth = ahead.get()["reward"]
    ahead.close()
    resumed = replay(99)
    resumed.set_rng_state(state)
    np.testing.assert_array_equal(resumed.sample(4, 8)["reward"], fourth.numpy())
    # ranks > 0 of a data-parallel resume reseed theirs from a SeedSequence
    for seed in (np.random.SeedSequence([0, 1, 96]), [0, 1, 96]):
        resumed.reseed(seed)
        again = resumed.sample(4, 8)["reward"]
        resumed.reseed(seed)
        np.testing.assert_array_equal(resumed.sample(4, 8)["reward"], again)
