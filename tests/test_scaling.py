"""Scale-out: data-parallel learners (torch.distributed, gloo) and Ray env runners.

Everything here runs on a 2-core CPU: two learner processes talk over gloo on localhost, and
the Ray test starts a local Ray instance with 2 CPUs and 2 runners.
"""

import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from determinism import deterministic_sampling
from procs import kill_group, popen_grouped, run_grouped
from lucid.config import make_config

B, T, H, UPDATES = 3, 8, 4, 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _agent(seed):
    from lucid.agent import Agent
    from lucid.envs import ActionSpec, ObsSpec
    import gymnasium as gym
    cfg = make_config("default", model={"size": "nano"},
                      train={"batch_size": B, "batch_length": T, "horizon": H})
    torch.manual_seed(seed)
    obs = ObsSpec.from_space(gym.spaces.Box(-5, 5, (4,), np.float32))
    return Agent(obs, ActionSpec.from_space(gym.spaces.Discrete(2)), cfg)


def _full_batch(rows):
    """A fixed batch of `rows` windows (CartPole-shaped, episode starts inside)."""
    rng = np.random.default_rng(123)
    act = np.eye(2, dtype=np.float32)[rng.integers(2, size=(rows, T))]
    first = rng.random((rows, T)) < 0.15
    term = np.roll(first, -1, 1) & (rng.random((rows, T)) < 0.5)
    return {"obs": {"vector": torch.as_tensor(rng.normal(size=(rows, T, 4)).astype(np.float32))},
            "action": torch.as_tensor(act), "reward": torch.as_tensor(
                rng.normal(size=(rows, T)).astype(np.float32)),
            "is_first": torch.as_tensor(first), "is_last": torch.as_tensor(term),
            "is_terminal": torch.as_tensor(term)}


def _train_recording(agent, batch):
    """UPDATES updates on `batch`; records the three losses of every update and the
    gradients each optimizer step uses (after any averaging, before clipping)."""
    grads, inner = [], agent.grad_sync

    def capture(params, loss):
        loss = inner(params, loss) if inner is not None else loss
        grads.append(torch.cat([p.grad.reshape(-1).clone() for p in params]))
        return loss

    agent.grad_sync = capture
    losses = []
    for _ in range(UPDATES):
        m = agent.train(batch)
        losses.append([m["world_model/loss"], m["actor/loss"], m["critic/loss"]])
    params = torch.cat([t.reshape(-1).double() for m in agent.modules().values()
                        for t in m.state_dict().values() if t.is_floating_point()])
    return {"losses": losses, "grads": grads, "params": params}


def _rank_main(rank, world, port, out_dir):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    deterministic_sampling()
    from lucid.distributed import DataParallel
    dp = DataParallel("cpu")
    agent = _agent(seed=1000 + rank)  # different initial weights: attach() must fix that
    dp.attach(agent)
    batch = {k: ({kk: vv[rank * B:(rank + 1) * B] for kk, vv in v.items()} if k == "obs"
                 else v[rank * B:(rank + 1) * B]) for k, v in _full_batch(world * B).items()}
    out = _train_recording(agent, batch)
    dp.check_identical(agent)
    out["checks"] = dp.checks
    out["gathered"] = dp.gather(torch.tensor([10.0 + rank])).flatten().tolist()
    out["summed"] = (dp.sum(rank + 1.0), dp.any(rank == 1), dp.any(False))
    grad = torch.zeros(3, requires_grad=True)
    grad.grad = torch.full((3,), float(rank))
    loss = dp.grad_sync([grad], torch.tensor(float("inf") if rank else 4.0))
    out["synced"] = (loss.item(), grad.grad.tolist())
    if rank == 1:  # drift in a bias (1-d) that keeps the actor's sum (exactly), not its
        with torch.no_grad():  # sum of squares
            w = next(p for p in agent.actor.parameters() if p.dim() == 1)
            a, b = w[0].double(), w[1].double()
            w[0] = (a + b).float()
            w[1] = ((a + b) - w[0].double()).float()
    try:
        dp.check_identical(agent)
        out["diverged"] = None
    except RuntimeError as exc:
        out["diverged"] = str(exc)
    torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    times = {}
    if rank == 1:  # the last to reach close(), and slow to tear down its backend
        time.sleep(0.3)
    destroy = torch.distributed.destroy_process_group

    def timed_destroy():
        times["destroying"] = time.time()
        if rank == 1:
            time.sleep(0.3)
        destroy()
        times["destroyed"] = time.time()

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(torch.distributed, "destroy_process_group", timed_destroy)
    times["entered"] = time.time()
    dp.close()
    times["left"] = time.time()
    times["threads"] = sorted(Path(f"/proc/self/task/{t}/comm").read_text().strip()
                              for t in os.listdir("/proc/self/task"))
    (Path(out_dir) / f"close{rank}.json").write_text(json.dumps(times))


def _run_two_ranks(target, *args, timeout: float) -> None:
    """Run `target(rank, world_size, port, *args)` in two processes and require both to exit
    cleanly within `timeout` seconds. Spawned, not forked: a child forked from a process whose
    OpenMP thread pool has run can hang in its first parallel op."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=target, args=(r, 2, port, *args)) for r in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.join(max(deadline - time.monotonic(), 0))
        assert [p.exitcode for p in procs] == [0, 0]
    finally:  # a rank left running would block the test session's exit, which joins it
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)


def test_two_gloo_learners_match_one_learner_with_the_full_batch(tmp_path, monkeypatch):
    """Two ranks with B windows each == one process with the same 2B windows.

    Every loss is a mean over the rows (and over T and H), so the average of the two ranks'
    gradients is the full batch's gradient in exact arithmetic; the λ-returns are gathered,
    so the return percentiles are those of the full batch. What remains is float32 rounding
    of sums taken in another order, about 1e-7 relative (measured: losses within 1e-6 of
    values ~10, gradients within 7e-7 of their largest entry; we allow 1e-5). Adam divides
    each step by the root of the second moment, so the parameters differ by that relative
    error times learning-rate-sized steps: after 3 updates < 1e-7 (measured 3e-8; allowed
    1e-6). Two different initializations (seeds 1000 and 1001) ending bit-identical shows the
    broadcast from rank 0."""
    _run_two_ranks(_rank_main, str(tmp_path), timeout=120)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2))
    # The ranks hold bit-identical parameters (and took the same averaged gradients).
    assert torch.equal(r0["params"], r1["params"])
    assert all(torch.equal(a, b) for a, b in zip(r0["grads"], r1["grads"]))
    assert r0["checks"] == 1
    # gather() stacks the ranks in order; grad_sync() averages gradients and the loss, so a
    # non-finite loss on one rank skips the step on every rank
    assert r0["gathered"] == r1["gathered"] == [10.0, 11.0]
    assert r0["summed"] == r1["summed"] == (3.0, True, False)
    assert r0["synced"] == r1["synced"] == (float("inf"), [0.5, 0.5, 0.5])
    # a rank whose parameters drifted is caught on every rank, with the module named
    for r in (r0, r1):
        assert r["diverged"] and "rank(s) [1]" in r["diverged"], r["diverged"]
        assert "in ['actor'] after 3 updates" in r["diverged"], r["diverged"]
    # close(): rank 0 (the store's host) left after rank 1 had arrived and torn down gloo
    c0, c1 = (json.loads((tmp_path / f"close{r}.json").read_text()) for r in range(2))
    assert c0["left"] >= c1["destroyed"] > c1["entered"] > c0["entered"]
    assert c0["destroying"] >= c1["entered"]  # rank 0 tore down gloo once both had arrived
    # and the group is gone with its threads (a group that outlives destroy_process_group
    # runs gloo's threads into the interpreter's exit, where a rank can abort)
    assert c0["threads"] and not any("gloo" in n or "tcpstore" in n
                                     for c in (c0, c1) for n in c["threads"])

    deterministic_sampling(monkeypatch.setattr)
    single = _agent(seed=1000)  # rank 0's initial weights
    full = _train_recording(single, _full_batch(2 * B))
    for u in range(UPDATES):
        mean_rank_loss = (np.array(r0["losses"][u]) + np.array(r1["losses"][u])) / 2
        np.testing.assert_allclose(mean_rank_loss, full["losses"][u], rtol=1e-5, atol=1e-6)
    assert len(r0["grads"]) == len(full["grads"]) == 3 * UPDATES
    for g_dist, g_full in zip(r0["grads"], full["grads"]):
        scale = g_full.abs().max()
        assert scale > 0
        assert (g_dist - g_full).abs().max() <= 1e-5 * scale
    assert (r0["params"] - full["params"]).abs().max() < 1e-6


def test_data_parallel_takes_its_place_from_torchruns_variables(tmp_path, monkeypatch):
    """On a second node, torchrun's RANK (global) differs from LOCAL_RANK (the GPU index)
    and WORLD_SIZE counts every node's ranks: a DataParallel made in a process whose group
    exists already (here a one-process gloo group) reads them as such and leaves that
    group to its owner; it refuses an agent that would capture its update in a CUDA graph."""
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    from lucid.distributed import DataParallel, launched
    assert launched()
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        dp = DataParallel("cpu")
        assert (dp.rank, dp.world, dp.local_rank, dp.is_main) == (3, 4, 1, False)
        assert dp.device == torch.device("cpu") and dp.backend == "gloo"
        assert not dp.owns_group
        agent = _agent(seed=0)
        agent.config.train.cuda_graph = True  # one process's capture: refused
        with pytest.raises(ValueError, match="train.cuda_graph=false"):
            dp.attach(agent)
        dp.close()
        assert torch.distributed.is_initialized()  # not its group to destroy
    finally:
        torch.distributed.destroy_process_group()


def _close_alone(rank, world, port, out_dir):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import lucid.distributed as distributed
    distributed.CLOSE_WAIT_S = 2.0
    dp = distributed.DataParallel("cpu")
    dp.sum(1.0)
    if rank == 1:
        os._exit(0)  # dies without close()
    time.sleep(0.5)
    start = time.monotonic()
    dp.close()
    (Path(out_dir) / "close_alone.json").write_text(json.dumps(time.monotonic() - start))


def test_close_does_not_hang_when_another_rank_died(tmp_path):
    """The error path: rank 1 is gone, rank 0's close() waits CLOSE_WAIT_S for it, then
    leaves (a collective barrier there would block until the 30-minute group timeout)."""
    _run_two_ranks(_close_alone, str(tmp_path), timeout=60)
    waited = json.loads((tmp_path / "close_alone.json").read_text())
    assert 2.0 <= waited < 20.0


def _dp_cfg(run_dir, recipe="2023", **run):
    preset, size = ("default", "nano") if recipe == "2023" else ("nature-cpu", "1m")
    return make_config(
        preset, env={"id": "CartPole-v1", "num_envs": 2}, model={"size": size},
        train={"batch_size": 3, "batch_length": 8, "horizon": 4, "prefill": 40,
               "train_ratio": 16, "replay_capacity": 10_000},
        run={"steps": 160, "log_every": 0.0, "progress": False, "run_dir": str(run_dir),
             "videos": False, "device": "cpu", "dist_check_every": 2, **run})


def _trainer_rank(rank, world, port, run_dir, out_dir, recipe="2023"):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from lucid.train import Trainer
    tr = Trainer(_dp_cfg(run_dir, recipe))
    try:
        tr.run()
        params = torch.cat([t.reshape(-1).double() for m in tr.agent.modules().values()
                            for t in m.state_dict().values() if t.is_floating_point()])
        first_obs = tr.replay.data["obs/vector"][:, 0].copy()
        torch.save({"params": params, "counters": dict(tr.counters), "checks": tr.ranks.checks,
                    "first_obs": first_obs}, Path(out_dir) / f"trainer{rank}.pt")
    finally:
        tr.close()


def _check_dp_run(run, steps, updates, checks):
    assert steps >= 160 and steps % 4 == 0  # 2 ranks x 2 envs per vector step
    # the train ratio over both ranks' env steps, each update replaying 2·B windows
    assert updates == math.floor((steps - 40) * 16 / (3 * 8 * 2)) > 0
    assert checks >= updates // 2 >= 1
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert rows[-1]["updates"] == updates and rows[-1]["dist/world_size"] == 2
    # one writer: one row per env-step round (both ranks writing would double them)
    assert len({r["env_steps"] for r in rows}) == len(rows)
    assert (run / "replay").is_dir() and (run / "replay-rank1").is_dir()
    assert len(list((run / "checkpoints").glob("*"))) >= 1


@pytest.mark.parametrize("recipe", ["2023", "nature"])
def test_two_learner_processes_train_with_identical_parameters(tmp_path, recipe):
    """Two gloo ranks run the Trainer on their own envs (seeded by rank): the parameters are
    bit-identical at the end (and were compared by checksum every 2 updates, the return
    normalizer's statistics included: the ranks' returns are gathered); only rank 0 wrote
    logs and checkpoints; the train ratio counts the steps of both ranks."""
    run = tmp_path / "run"
    _run_two_ranks(_trainer_rank, str(run), str(tmp_path), recipe, timeout=180)
    r0, r1 = (torch.load(tmp_path / f"trainer{r}.pt", weights_only=False) for r in range(2))
    assert torch.equal(r0["params"], r1["params"])
    assert r0["counters"]["updates"] == r1["counters"]["updates"]
    assert r0["counters"]["env_steps"] == r1["counters"]["env_steps"]
    assert not np.array_equal(r0["first_obs"], r1["first_obs"])  # own envs, own seeds
    _check_dp_run(run, r0["counters"]["env_steps"], r0["counters"]["updates"], r0["checks"])


def _failing_start(rank, world, port, run_dir, out_dir, where):
    """Rank 0's start fails after its run directory was made, at `where`: its agent (before
    the ranks share parameters) or its env runners (after); rank 1 gets there 3 s later, so
    that it carries on after rank 0 has given up. With where="replay", rank 1's replay
    cannot be made instead."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import lucid.learning
    from lucid.agent import Agent
    from lucid.train import Trainer
    cls, name = {"agent": (Agent, "__init__"), "collector": (lucid.learning, "make_collector"),
                 "replay": (lucid.learning, "make_replay")}[where]
    step = getattr(cls, name)

    def failing(*args, **kwargs):
        if where == "replay":  # rank 1's memory-mapped ring, made after the start
            if rank == 1 and kwargs.get("build", True):
                raise OSError(28, "No space left on device")
        elif rank == 0:
            raise MemoryError(f"rank 0's {where} failed")
        else:
            time.sleep(3.0)
        return step(*args, **kwargs)

    setattr(cls, name, failing)
    cfg = _dp_cfg(run_dir)
    cfg.train.replay_memmap = True
    try:
        Trainer(cfg)
    except BaseException as exc:  # rank 1: the collective with the rank that left
        (Path(out_dir) / f"failed{rank}.txt").write_text(repr(exc))


@pytest.mark.parametrize("where", ["agent", "collector", "replay"])
def test_a_failed_start_leaves_no_run_directory_behind_on_any_rank(tmp_path, where):
    """Rank 0 takes a new run's directory away when its start fails; a rank > 0 must not
    write into it afterwards (its memory-mapped replay's ring files used to recreate
    run/replay-rank1/ when its own start was slower), and a rank > 0 whose replay fails
    stops rank 0 too, which then takes the directory away. A rank stopped by a collective
    with a rank that left is stopped by the test after 15 s, as torchrun would."""
    run = tmp_path / "run"
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_failing_start,
                         args=(r, 2, port, str(run), str(tmp_path), where)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        procs[0].join(60)
        assert procs[0].exitcode == 0
        failed = (tmp_path / "failed0.txt").read_text()
        assert ("MemoryError" in failed if where != "replay"
                else "another data-parallel rank could not make its replay" in failed)
        procs[1].join(15)  # rank 1's 3 s, its start, the collective's error
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
    if where == "replay":
        assert "No space left" in (tmp_path / "failed1.txt").read_text()
    assert not run.exists(), sorted(str(p.relative_to(run)) for p in run.rglob("*"))


@pytest.mark.slow
def test_torchrun_cli_two_learners(tmp_path):
    """The same through `torchrun --nproc-per-node 2 -m lucid train` (a checksum mismatch
    would end the run with an error). Slow only for its three fresh interpreters (~40 s)."""
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(_free_port()), "-m", "lucid", "train", "CartPole-v1",
           "--steps", "160", "--run-dir", str(run), "--size", "nano", "--device", "cpu",
           "env.num_envs=2", "train.batch_size=3", "train.batch_length=8", "train.horizon=4",
           "train.prefill=40", "train.train_ratio=16", "run.dist_check_every=2",
           "run.log_every=0", "run.progress=false", "run.videos=false"]
    res = run_grouped(cmd, env=env, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    _check_dp_run(run, last["env_steps"], last["updates"], last["dist/param_checks"])


@pytest.mark.slow
def test_torchrun_two_nodes_rendezvous(tmp_path):
    """Multi-node as torchrun runs it: two launchers (`--nnodes 2`, one process each) meet
    through a c10d rendezvous endpoint, here both on this machine; the two learners train
    together with identical parameters (checked every 2 updates) as on one node."""
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    endpoint = f"127.0.0.1:{_free_port()}"
    cmds = [[sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
             "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
             "--rdzv-id", "lucid-test", "--rdzv-conf", f"is_host={int(node == 0)}",
             "-m", "lucid", "train", "CartPole-v1", "--steps", "160", "--run-dir", str(run),
             "--size", "nano", "--device", "cpu", "env.num_envs=2", "train.batch_size=3",
             "train.batch_length=8", "train.horizon=4", "train.prefill=40",
             "train.train_ratio=16", "run.dist_check_every=2", "run.log_every=0",
             "run.progress=false", "run.videos=false"] for node in (0, 1)]
    procs = [popen_grouped(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True) for c in cmds]
    outs, deadline = [], time.monotonic() + 300
    try:
        for proc in procs:
            outs.append(proc.communicate(timeout=max(deadline - time.monotonic(), 1))[0])
    finally:
        for proc in procs:
            kill_group(proc)
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert (run / "replay-rank1").is_dir()  # the second node's learner kept its own replay
    _check_dp_run(run, last["env_steps"], last["updates"], last["dist/param_checks"])


def test_ray_runners_keep_the_train_ratio_and_replace_a_killed_runner(tmp_path):
    ray = pytest.importorskip("ray")
    from lucid.train import Trainer
    prefill, ratio = 48, 8
    cfg = make_config(
        "default", env={"id": "CartPole-v1"}, model={"size": "nano"},
        train={"batch_size": 4, "batch_length": 16, "horizon": 4, "prefill": prefill,
               "replay_capacity": 10_000, "train_ratio": ratio},
        run={"steps": 320, "log_every": 0.0, "progress": False, "run_dir": str(tmp_path),
             "runners": "ray", "num_runners": 2, "envs_per_runner": 2, "runner_chunk": 8,
             "ray_num_cpus": 2, "videos": False, "weight_sync_every": 2})
    tr = Trainer(cfg)
    killed = {}

    def kill_runner_mid_run(info):  # from the training loop, at an episode's end
        if not killed and info["env_steps"] >= 160:
            killed["at"] = info["env_steps"]
            ray.kill(tr.collector.runners[0])

    try:
        tr.collector.start()
        killed_pid = ray.get(tr.collector.runners[0].ping.remote())
        tr.run(callback=kill_runner_mid_run)
        c = tr.counters
        assert killed and killed["at"] < c["env_steps"]
        assert tr.collector.runner_restarts == 1 and tr.collector.dropped_chunks == 1
        new_pid = ray.get(tr.collector.runners[0].ping.remote())
        assert new_pid != killed_pid
        # the train ratio, exactly, over the steps the learner received
        assert c["env_steps"] >= 320 and c["env_steps"] % 16 == 0  # chunks of 2 envs x 8
        assert c["updates"] == math.floor((c["env_steps"] - prefill) * ratio / (4 * 16)) > 0
        # both runners' streams reached the replay, each in its own part
        stored = [p.stored for p in tr.replay.parts]
        assert sum(stored) * 2 == c["env_steps"] and min(stored) > 0
        rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
        assert rows[-1]["runners/restarts"] == 1
        # policy lag: a chunk of 16 steps makes 2 updates (ratio 8, B·T 64), so a chunk's
        # weights are >= 2 updates old when it arrives once updates run, and a few chunks
        # at most (docs/scaling.md); never negative
        lags = [(r["runners/policy_lag"], r["runners/policy_lag_max"]) for r in rows
                if "runners/policy_lag" in r]
        assert lags and min(m for m, _ in lags) >= 0
        assert 2 <= max(top for _, top in lags) <= 64, lags
        assert any(r["updates"] > 0 for r in rows)
        # the policy reached the runners: weights were sent after updates began
        assert tr.collector._weights[1] > 0
    finally:
        tr.close()
    assert not ray.is_initialized()


@pytest.mark.parametrize("fail_at", ["step", "reset"])
def test_ray_runners_that_fail_the_same_way_stop_the_run_with_the_cause(tmp_path, fail_at):
    """A runner whose code raises (here: its env fails at every step, or at reset, so in the
    runner's constructor, in any process but the learner's, with no env restarts allowed)
    is not replaced forever: the third identical failure in a row stops the run, naming the
    runner's own exception."""
    pytest.importorskip("ray")
    from lucid.train import EnvError, Trainer
    (tmp_path / "fail_env.py").write_text(
        "import os\n"
        "import gymnasium as gym\n"
        "import numpy as np\n\n"
        "class FailElsewhere(gym.Env):\n"
        "    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)\n"
        "    action_space = gym.spaces.Discrete(2)\n\n"
        "    def __init__(self, home=0, fail_at='step'):\n"
        "        self.home, self.fail_at = home, fail_at\n\n"
        "    def _check(self, where):\n"
        "        if where == self.fail_at and os.getpid() != self.home:\n"
        "            raise RuntimeError(f'the cable is cut at {where}')\n\n"
        "    def reset(self, *, seed=None, options=None):\n"
        "        self._check('reset')\n"
        "        return np.zeros(2, np.float32), {}\n\n"
        "    def step(self, action):\n"
        "        self._check('step')\n"
        "        return np.zeros(2, np.float32), 0.0, False, False, {}\n")
    cfg = make_config(
        "default", env={"id": f"{tmp_path / 'fail_env.py'}:FailElsewhere", "max_restarts": 0,
                        "kwargs": {"home": os.getpid(), "fail_at": fail_at}},
        model={"size": "nano"},
        train={"batch_size": 2, "batch_length": 8, "horizon": 3, "prefill": 16,
               "train_ratio": 8},
        run={"steps": 200, "log_every": 0.0, "progress": False, "run_dir": str(tmp_path / "run"),
             "runners": "ray", "num_runners": 1, "envs_per_runner": 1, "runner_chunk": 8,
             "ray_num_cpus": 1, "videos": False})
    tr = Trainer(cfg)
    try:
        with pytest.raises(EnvError, match=r"failed 3 times in a row with the same error.*"
                                           rf"the cable is cut at {fail_at}"):
            tr.run()
        assert tr.collector.runner_restarts == 3
    finally:
        tr.close()


def test_ray_runner_errors_between_good_chunks_are_not_in_a_row(tmp_path):
    """Each runner delivers one chunk, then its env raises the same error. The errors are
    never three in a row (a chunk arrives between them), so runners are replaced and the
    run reaches its steps instead of stopping at the third error."""
    pytest.importorskip("ray")
    from lucid.train import Trainer
    (tmp_path / "flaky_env.py").write_text(
        "import os\n"
        "import gymnasium as gym\n"
        "import numpy as np\n\n"
        "STEPS = 0  # per process: each new runner starts again\n\n"
        "class SecondChunkFails(gym.Env):\n"
        "    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)\n"
        "    action_space = gym.spaces.Discrete(2)\n\n"
        "    def __init__(self, home=0):\n"
        "        self.home = home\n\n"
        "    def reset(self, *, seed=None, options=None):\n"
        "        return np.zeros(2, np.float32), {}\n\n"
        "    def step(self, action):\n"
        "        global STEPS\n"
        "        STEPS += 1\n"
        "        if STEPS == 12 and os.getpid() != self.home:\n"
        "            raise RuntimeError('the cable is cut again')\n"
        "        return np.zeros(2, np.float32), 0.0, False, False, {}\n")
    cfg = make_config(
        "default", env={"id": f"{tmp_path / 'flaky_env.py'}:SecondChunkFails",
                        "max_restarts": 0, "kwargs": {"home": os.getpid()}},
        model={"size": "nano"},
        train={"batch_size": 2, "batch_length": 8, "horizon": 3, "prefill": 16,
               "train_ratio": 8},
        run={"steps": 32, "log_every": 0.0, "progress": False, "run_dir": str(tmp_path / "run"),
             "runners": "ray", "num_runners": 1, "envs_per_runner": 1, "runner_chunk": 8,
             "ray_num_cpus": 1, "videos": False, "max_runner_restarts": 50})
    tr = Trainer(cfg)
    try:
        tr.run()
        assert tr.counters["env_steps"] >= 32
        assert tr.collector.runner_restarts >= 3  # more errors than REPEATS_FATAL in all
    finally:
        tr.close()


def test_ray_runners_bring_each_episodes_last_info(tmp_path):
    """The info of an episode's last step travels back from a Ray runner, so Crafter's
    achievements reach the score (and the learn() callback) as they do with local envs."""
    pytest.importorskip("ray")
    from lucid.train import Trainer
    (tmp_path / "wood_env.py").write_text(
        "import gymnasium as gym\n"
        "import numpy as np\n\n"
        "class Wood(gym.Env):\n"
        "    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)\n"
        "    action_space = gym.spaces.Discrete(2)\n\n"
        "    def reset(self, *, seed=None, options=None):\n"
        "        self.t = 0\n"
        "        return np.zeros(2, np.float32), {}\n\n"
        "    def step(self, action):\n"
        "        self.t += 1\n"
        "        end = self.t == 4\n"
        "        info = {'episode_achievements': {'collect_wood': 1}} if end else {}\n"
        "        return np.zeros(2, np.float32), 0.0, end, False, info\n")
    counts = {}
    for runners in ("ray", "local"):
        cfg = make_config(
            "default", env={"id": f"{tmp_path / 'wood_env.py'}:Wood"}, model={"size": "nano"},
            train={"batch_size": 2, "batch_length": 8, "horizon": 3, "prefill": 16,
                   "train_ratio": 8},
            run={"steps": 32, "log_every": 0.0, "progress": False, "videos": False,
                 "run_dir": str(tmp_path / runners), "runners": runners, "num_runners": 1,
                 "envs_per_runner": 1, "runner_chunk": 8, "ray_num_cpus": 1})
        tr = Trainer(cfg)
        try:
            tr.run()
            counts[runners] = tr.achievements.episodes
            assert tr.achievements.episodes == tr.counters["episodes"] >= 4
            assert tr.achievements.metrics()["crafter/success/collect_wood"] == 100.0
        finally:
            tr.close()
    assert counts["ray"] == counts["local"], counts  # the same 32 steps either way


def test_a_ray_runner_acts_on_its_cpu_whatever_the_learners_speed_switches():
    """A runner acts with a CPU copy of the policy: a learner's train.cuda_graph (GPU only)
    or train.compile must not stop it from starting (cuda_graph used to: every runner
    raised at construction and the run stopped)."""
    from lucid.config import to_yaml
    from lucid.ray_runners import EnvRunner
    cfg = make_config("default", env={"id": "CartPole-v1"}, model={"size": "nano"},
                      train={"cuda_graph": True, "compile": True})
    runner = EnvRunner(to_yaml(cfg), index=0, seed=1, num_envs=2)
    out = runner.sample(5, explore_random=True)
    assert out["chunk"]["reward"].shape == (2, 5)
    assert not runner.agent.config.train.cuda_graph and not runner.agent.config.train.compile


def _state(module):
    return torch.cat([t.reshape(-1).double() for t in module.state_dict().values()
                      if t.is_floating_point()])


def test_a_ray_runner_acts_with_the_weights_it_was_sent():
    """A runner starts with random actions (no weights yet, version None); weights sent with
    a task replace both its world model and its actor, and every later chunk reports their
    version until new ones arrive; prefill chunks (explore_random) report no version."""
    from lucid.config import to_yaml
    from lucid.ray_runners import EnvRunner
    cfg = make_config("default", env={"id": "CartPole-v1"}, model={"size": "nano"})
    runner = EnvRunner(to_yaml(cfg), index=0, seed=1, num_envs=1)
    learner = EnvRunner(to_yaml(cfg), index=1, seed=2, num_envs=1).agent  # other weights
    assert not torch.equal(_state(runner.agent.wm), _state(learner.wm))
    assert not torch.equal(_state(runner.agent.actor), _state(learner.actor))
    assert runner.sample(2)["version"] is None
    weights = {"world_model": learner.wm.state_dict(), "actor": learner.actor.state_dict()}
    assert runner.sample(2, weights, version=5)["version"] == 5
    assert torch.equal(_state(runner.agent.wm), _state(learner.wm))
    assert torch.equal(_state(runner.agent.actor), _state(learner.actor))
    assert runner.sample(2)["version"] == 5
    assert runner.sample(2, explore_random=True)["version"] is None


def test_ray_runners_are_seeded_by_their_seed():
    """Two runners with the same seed start the same envs with the same policy; another
    seed gives other envs (runners must not all collect the same episodes)."""
    from lucid.config import to_yaml
    from lucid.ray_runners import EnvRunner
    cfg = make_config("default", env={"id": "CartPole-v1"}, model={"size": "nano"})
    a, b, c = (EnvRunner(to_yaml(cfg), index=0, seed=s, num_envs=2) for s in (7, 7, 8))
    obs = [r.sample(3, explore_random=True)["chunk"]["obs/vector"] for r in (a, b, c)]
    np.testing.assert_array_equal(obs[0], obs[1])
    assert not np.array_equal(obs[0], obs[2])
    assert torch.equal(_state(a.agent.actor), _state(b.agent.actor))


class _RunnerInitFailed(Exception):
    """Shaped as Ray's error for a runner whose constructor raised (its last line names the
    runner's own exception)."""
    actor_init_failed = True


def _ray_config(**run):
    """A nano CartPole config with Ray runners and these run.* settings."""
    return make_config("default", env={"id": "CartPole-v1"}, model={"size": "nano"},
                       run={"runners": "ray", **run})


def test_ray_runner_replacement_counts_failures_in_a_row_and_resets_the_runners_state(
        monkeypatch):
    """_replace(), without Ray actors (the actors it starts and kills are names): a replaced
    runner gets the newest weights with its first task and counts its env restarts from 0;
    only the same error three times in a row is fatal (alternating errors are not),
    and the run stops once run.max_runner_restarts replacements are spent."""
    ray = pytest.importorskip("ray")
    from lucid.ray_runners import RayCollector
    from lucid.runner import EnvError
    cfg = _ray_config(num_runners=2, max_runner_restarts=7)
    col = RayCollector(cfg, seed=3)
    started, killed = [], []
    monkeypatch.setattr(col, "_start", lambda i: started.append(i) or f"runner {i}.{len(started)}")
    monkeypatch.setattr(ray, "kill", killed.append)
    col.runners, col.versions, col.env_restarts_seen = ["a", "b"], [5, 6], [2, 3]
    col._replace(0, RuntimeError("lost with its node"))
    assert col.runners == ["runner 0.1", "b"] and col.versions == [-1, 6]
    assert col.env_restarts_seen == [0, 3]
    assert col.runner_restarts == col.dropped_chunks == 1 and killed == ["a"]
    for cause in ("header\nValueError: A", "header\nValueError: B") * 2:  # never in a row
        col._replace(1, _RunnerInitFailed(cause))
    col._replace(1, _RunnerInitFailed("header\nValueError: B"))
    with pytest.raises(EnvError, match="failed 3 times in a row .*ValueError: B"):
        col._replace(1, _RunnerInitFailed("header\nValueError: B"))
    col._repeats = ("", 0)
    assert col.runner_restarts == 7
    with pytest.raises(EnvError, match="more than run.max_runner_restarts=7"):
        col._replace(0, RuntimeError("lost with its node"))
    assert started == [0, 1, 1, 1, 1, 1]


class _Ref:
    """A stand-in for a Ray ObjectRef: the runner that answers and its answer."""

    def __init__(self, runner, out):
        self.runner, self.out = runner, out


class _FakeRunner:
    """A stand-in for an EnvRunner actor handle: `sample.remote()` keeps the version of the
    weights held as EnvRunner.sample does and answers with the next cumulative env-restart
    count of its script ("die": the task's result is lost with the runner)."""

    def __init__(self, index, restarts):
        self.index, self.restarts, self.version, self.sent = index, list(restarts), -1, []
        self.sample = self
        self.remote = self._sample

    def _sample(self, length, weights, version, explore_random):
        self.sent.append(None if weights is None else version)
        if weights is not None:
            self.version = version
        acting = not explore_random and self.version >= 0
        count = self.restarts.pop(0) if self.restarts else 0
        return _Ref(self.index, "die" if count == "die" else {
            "chunk": {"reward": np.zeros((1, length), np.float32)}, "episodes": [],
            "version": self.version if acting else None, "restarts": count})


def _fake_ray_pool(monkeypatch, cfg, scripts, order):
    """A RayCollector whose actors are _FakeRunners (runner i's k-th start plays
    scripts[i][k]) and whose ray.wait answers the runners in `order`."""
    ray = pytest.importorskip("ray")
    from lucid.ray_runners import RayCollector
    col = RayCollector(cfg, seed=0)
    started = []

    def start(i):
        started.append(_FakeRunner(i, scripts[i].pop(0)))
        return started[-1]

    def wait(refs, num_returns):
        ref = next(r for r in refs if r.runner == order[0])
        order.pop(0)
        return [ref], [r for r in refs if r is not ref]

    def get(ref):
        if ref.out == "die":
            raise ray.exceptions.RayError(f"runner {ref.runner} was lost with its node")
        return ref.out

    puts = []
    monkeypatch.setattr(col, "_start", start)
    monkeypatch.setattr(ray, "wait", wait)
    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(ray, "put", lambda obj: puts.append(obj) or f"weights {len(puts)}")
    monkeypatch.setattr(ray, "kill", lambda actor: None)
    return col, started, puts


class _Learner:
    """What the pool reads of the learner's agent: its update count and the weights it sends."""

    def __init__(self):
        self.updates, self.wm, self.actor = 0, torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)


class _Replay:
    def __init__(self):
        self.parts = []

    def add_chunk(self, i, chunk):
        self.parts.append(i)


def test_a_ray_runner_gets_new_weights_once_weight_sync_every_updates_are_made(monkeypatch):
    """With run.weight_sync_every=3, a runner acting for the learner gets the weights with
    its first task and then again exactly when the learner has made 3 updates since its copy
    (not 4); prefill tasks carry none, and each version's weights are put in Ray once."""
    cfg = _ray_config(num_runners=1, envs_per_runner=1, runner_chunk=4, weight_sync_every=3)
    col, runners, puts = _fake_ray_pool(monkeypatch, cfg, {0: [[]]}, [0] * 9)
    agent = _Learner()
    replay = _Replay()
    assert col.collect(None, replay) == (4, [])  # prefill: random actions, no weights
    for updates in range(8):
        agent.updates = updates
        assert col.collect(agent, replay) == (4, [])
    assert runners[0].sent == [None, None, 0, None, None, 3, None, None, 6, None]
    assert len(puts) == 3 and torch.equal(puts[-1]["actor"]["weight"], agent.actor.weight)


def test_ray_runners_env_restarts_are_summed_over_runners_and_replacements(monkeypatch):
    """Each runner reports its envs' restarts so far; the learner's count (the run's
    train/env_restarts) is the sum of every runner's increments, and a replacement runner's
    count, which starts from 0 again, adds to it rather than being taken for a decrease."""
    cfg = _ray_config(num_runners=2, envs_per_runner=1, runner_chunk=3, max_runner_restarts=5)
    scripts = {0: [[1, 1, 3, "die"], [1, 2]], 1: [[0, 2, 2]]}
    col, runners, _ = _fake_ray_pool(monkeypatch, cfg, scripts, [0, 1, 0, 1, 0, 0, 0, 1])
    replay, counts = _Replay(), []
    for _ in range(8):
        col.collect(None, replay)
        counts.append(col.restarts)
    # runner 0: 1, 1, 3, lost, then its replacement 1, 2; runner 1: 0, 2, 2
    assert counts == [1, 1, 1, 3, 5, 5, 6, 6]
    assert col.runner_restarts == 1 and len(runners) == 3
    assert replay.parts == [0, 1, 0, 1, 0, 0, 1]


def test_ray_runner_metrics_cover_the_chunks_and_time_since_the_last_row(monkeypatch):
    """metrics() reports the policy lag (the learner's updates when a chunk arrives minus
    those of the weights that collected it; mean and max) of the chunks received since the
    last call, and the fraction of the time since then that the learner waited for chunks."""
    from lucid import ray_runners
    clock = [100.0]
    monkeypatch.setattr(ray_runners, "time", type("Clock", (), {"time": lambda: clock[0]}))
    cfg = _ray_config(num_runners=1, envs_per_runner=1, runner_chunk=2, weight_sync_every=1)
    col, _, _ = _fake_ray_pool(monkeypatch, cfg, {0: [[]]}, [0] * 6)
    ray = pytest.importorskip("ray")
    answer = ray.wait

    def wait(refs, num_returns):  # each chunk keeps the learner waiting 1 s
        clock[0] += 1
        return answer(refs, num_returns)

    monkeypatch.setattr(ray, "wait", wait)
    agent = _Learner()
    replay = _Replay()

    def collect(updates):  # after 3 s of learning
        clock[0] += 3
        agent.updates = updates
        col.collect(None if updates is None else agent, replay)

    for updates in (None, 0, 2, 3):  # prefill; weights of 0 arrive at 2, of 2 at 3
        collect(updates)
    row = col.metrics()
    assert row["runners/policy_lag"] == 1.5 and row["runners/policy_lag_max"] == 2
    assert row["runners/learner_wait_fraction"] == pytest.approx(4 / 16)
    for updates in (3, 7):  # weights of 3 arrive at 3, and (not resent) at 7
        collect(updates)
    row = col.metrics()
    assert row["runners/policy_lag"] == 2 and row["runners/policy_lag_max"] == 4
    assert row["runners/learner_wait_fraction"] == pytest.approx(2 / 8)


def test_a_local_ray_instance_gets_the_cpus_its_runners_reserve(monkeypatch):
    """With run.ray_num_cpus=0 a local Ray instance gets num_runners x runner_cpus CPUs
    (rounded up, at least 1), so that every runner can be scheduled; run.ray_num_cpus sets
    them, and run.ray_address joins a cluster instead."""
    ray = pytest.importorskip("ray")
    from lucid.ray_runners import RayCollector
    inits = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: inits.append(kwargs))
    for run, cpus in (({"num_runners": 3, "runner_cpus": 0.5}, 2),
                      ({"num_runners": 1, "runner_cpus": 0.25}, 1),
                      ({"num_runners": 2, "runner_cpus": 2.0}, 4),
                      ({"num_runners": 2, "ray_num_cpus": 5}, 5)):
        cfg = _ray_config(**run)
        col = RayCollector(cfg)
        col._init_ray()
        assert inits[-1]["num_cpus"] == cpus and col.started_ray, run
    cfg = _ray_config(num_runners=2, ray_address="auto")
    RayCollector(cfg)._init_ray()
    assert inits[-1]["address"] == "auto" and "num_cpus" not in inits[-1]


def test_ray_runners_and_their_replacements_get_seeds_of_their_own(monkeypatch):
    """Runner i of a run seeded s starts with a seed of its own, and a replacement runner
    with one that neither it nor any other runner had (so it does not replay their
    episodes); the actors reserve run.runner_cpus and are not restarted by Ray."""
    ray = pytest.importorskip("ray")
    from lucid.ray_runners import RayCollector
    made = []

    class Actor:
        def options(self, **options):
            made.append(options)
            return self

        def remote(self, cfg_yaml, index, seed, num_envs):
            made.append((index, seed, num_envs))
            return f"runner {index}"

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "remote", lambda cls: Actor())
    monkeypatch.setattr(ray, "kill", lambda actor: None)
    cfg = _ray_config(num_runners=3, envs_per_runner=2, runner_cpus=0.5)
    col = RayCollector(cfg, seed=5)
    col.start()
    col._replace(1, RuntimeError("lost with its node"))
    col._replace(1, RuntimeError("lost with its node"))
    assert made[0::2] == [{"num_cpus": 0.5, "max_restarts": 0}] * 5
    starts = made[1::2]
    assert [(i, n) for i, _, n in starts] == [(0, 2), (1, 2), (2, 2), (1, 2), (1, 2)]
    seeds = [seed for _, seed, _ in starts]
    assert len(set(seeds)) == 5 and seeds[0] != 5


def test_replay_group_samples_every_part_and_add_chunk_matches_add():
    from lucid.replay import Replay, ReplayGroup
    fields = {"obs/vector": ((1,), np.float32), "action": ((1,), np.float32),
              "reward": ((), np.float32), "is_first": ((), bool), "is_last": ((), bool),
              "is_terminal": ((), bool)}

    def steps(n, envs, offset):
        t = np.arange(n)[None, :] + offset + 1000 * np.arange(envs)[:, None]
        return {"obs/vector": t[..., None].astype(np.float32),
                "action": np.zeros((envs, n, 1), np.float32), "reward": t.astype(np.float32),
                "is_first": np.zeros((envs, n), bool), "is_last": np.zeros((envs, n), bool),
                "is_terminal": np.zeros((envs, n), bool)}

    a, b = Replay(40, 2, fields), Replay(40, 2, fields)
    for off, n in ((0, 10), (10, 10), (20, 10), (30, 10), (40, 10), (50, 27), (77, 3)):
        chunk = steps(n, 2, off)  # wraps the 20-step rings; one chunk longer than a ring
        a.add_chunk(chunk)
        for i in range(n):
            b.add({k: v[:, i] for k, v in chunk.items()})
    assert a.pos == b.pos and a.count == b.count
    for k in a.data:
        np.testing.assert_array_equal(a.data[k], b.data[k])

    parts = [Replay(100, 1, fields, seed=1), Replay(100, 2, fields, seed=2)]
    group = ReplayGroup(parts, seed=0)
    assert not group.can_sample(5)
    group.add_chunk(0, {k: v[:1] for k, v in steps(10, 1, 0).items()})
    group.add_chunk(1, {k: v + (5000 if k == "obs/vector" else 0)
                        for k, v in steps(30, 2, 0).items()})
    s = np.concatenate([group.sample(400, 5)["obs/vector"][..., 0] for _ in range(100)])
    assert s.shape == (40_000, 5)
    assert np.all(np.diff(s, axis=1) == 1)  # contiguous windows
    from_part0 = (s[:, 0] < 1000).mean()
    # windows: part 0 holds 1 x 6, part 1 holds 2 x 26 -> 6/58 of the draws from part 0
    # (within 4 standard errors; one window fewer or more per env is 8 or more away)
    p0 = 6 / 58
    assert abs(from_part0 - p0) < 4 * np.sqrt(p0 * (1 - p0) / len(s)), from_part0
    assert len(group) == 10 + 60


@pytest.mark.slow
def test_ray_runners_feed_two_learners(tmp_path):
    """The two compose: 2 torchrun ranks, each with its own local Ray and one runner of 2
    envs; the ranks sum their chunks' steps and train together (~90 s on one core)."""
    pytest.importorskip("ray")
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(_free_port()), "-m", "lucid", "train", "CartPole-v1",
           "--steps", "256", "--run-dir", str(run), "--size", "nano", "--device", "cpu",
           "--runners", "ray", "--num-runners", "1", "--envs-per-runner", "2",
           "train.batch_size=3", "train.batch_length=8", "train.horizon=4",
           "train.prefill=64", "train.train_ratio=16", "run.runner_chunk=8",
           "run.dist_check_every=2", "run.log_every=0", "run.progress=false",
           "run.videos=false"]
    res = run_grouped(cmd, env=env, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["env_steps"] >= 256 and last["env_steps"] % 32 == 0  # 2 ranks x 2 envs x 8
    assert last["updates"] == math.floor((last["env_steps"] - 64) * 16 / (3 * 8 * 2)) > 0
    assert last["dist/param_checks"] >= last["updates"] // 2
    assert "runners/policy_lag" in last and last["runners/restarts"] == 0
    assert (run / "replay" / "runner-0").is_dir() and (run / "replay-rank1" / "runner-0").is_dir()
