"""`train.cuda_graph`: the update captured as one CUDA graph. What makes that possible is
checked on the CPU: the update reads nothing back to the host (so it can be captured), and
the warm-up before a capture is undone exactly (so the replayed updates start where the agent
was). The capture itself needs a GPU: those tests run where CUDA is (benchmarks/gpu_suite.sh
runs them on the H200) and are skipped elsewhere."""

import sys
import traceback
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from train_step import batch_for, spaces  # noqa: E402

from determinism import deterministic_sampling  # noqa: E402
from lucid.agent import Agent  # noqa: E402
from lucid.graph import restore, snapshot  # noqa: E402
from lucid.nature_agent import NatureAgent  # noqa: E402
from lucid.config import ConfigError, make_config  # noqa: E402

# Operators that read a tensor's value on the host (.item(), bool(), data-dependent shapes)
# or make a tensor from host data during the update (a host-to-device copy on a GPU).
HOST_READS = {"_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "equal",
              "lift_fresh", "lift_fresh_copy"}


class HostReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen: dict[str, str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in HOST_READS and name not in self.seen:
            self.seen[name] = "".join(traceback.format_stack(limit=6)[:-1])
        return func(*args, **(kwargs or {}))


def _agent(obs="vector", action="discrete", device="cpu", seed=0, **train):
    # eager fp32 unless asked (on CUDA, null would choose compiled bf16)
    cfg = make_config("default", model={"size": "nano"},
                      train={"batch_size": 3, "batch_length": 8, "horizon": 4, "compile": False,
                             "precision": "fp32", **train})
    obs_spec, act_spec = spaces(obs, action)
    torch.manual_seed(seed)
    return Agent(obs_spec, act_spec, cfg, device), batch_for(obs_spec, act_spec, 3, 8, device)


def _nature(obs="vector", action="discrete", device="cpu", seed=0, **train):
    """The Nature recipe's agent at 1m, eager fp32 unless asked, windows from the zero state
    (the replay context's latents are written outside the update)."""
    cfg = make_config("nature", model={"size": "1m"},
                      train={"batch_size": 3, "batch_length": 8, "horizon": 4,
                             "replay_context": 0, "lr_warmup": 0, "compile": False,
                             "precision": "fp32", **train})
    obs_spec, act_spec = spaces(obs, action)
    torch.manual_seed(seed)
    return (NatureAgent(obs_spec, act_spec, cfg, device),
            batch_for(obs_spec, act_spec, 3, 8, device))


@pytest.mark.parametrize("obs,action,train", [
    ("vector", "discrete", {"recipe": "nature"}),
    ("image", "mixed", {"recipe": "nature", "precision": "bf16"}),
    ("vector", "discrete", {}),
    ("vector", "discrete", {"onehot_gather": False}),
    ("image", "continuous", {}),  # backpropagation through the dynamics
    ("vector", "continuous", {"continuous_grad": "reinforce", "precision": "bf16"}),
    ("vector", "discrete", {"replay_value_scale": 0.3}),
    ("vector", "discrete", {"replay_value_scale": 0.3, "replay_value_grad": True}),
    ("vector", "continuous", {"replay_value_scale": 0.3, "replay_value_grad": True}),
])
def test_update_reads_nothing_back_to_the_host(obs, action, train):
    train = dict(train)
    if train.pop("recipe", "2023") == "nature":
        agent, batch = _nature(obs, action, **train)
    else:
        agent, batch = _agent(obs, action, **train)
        agent.wm.skip_resets = False  # as on GPUs
    agent.train_step(batch)  # optimizer state exists from here on, as in a captured update
    batch["reward"][0, 2] = float("nan")  # a skipped step is decided on the device too
    with HostReads() as probe:
        metrics = agent.train_step(batch)
    assert not probe.seen, "host reads in the update:\n" + "\n".join(
        f"{k}:\n{v}" for k, v in probe.seen.items())
    # The world model's step; the critic's too where it also learns from replayed rewards;
    # the Nature recipe's one step.
    skipped = 1 + (train.get("replay_value_scale", 0) > 0) if isinstance(agent, Agent) else 1
    assert float(metrics["train/nonfinite_steps"]) == skipped


def test_with_resets_every_step_the_update_is_the_same(monkeypatch):
    """`skip_resets` (CPU) skips arithmetic only where no row starts: same losses either way."""
    deterministic_sampling(monkeypatch.setattr)
    out = []
    for skip in (True, False):
        agent, batch = _agent()
        agent.wm.skip_resets = skip
        out.append([agent.train(batch) for _ in range(2)])
    for a, b in zip(*out):
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-7), k


def _state(agent):
    tensors = [t for m in agent.modules().values() for t in m.state_dict().values()]
    for o in agent.optimizers().values():
        tensors += [v for st in o.state.values() for v in st.values() if torch.is_tensor(v)]
    return tensors


@pytest.mark.parametrize("seeds", [False, True])  # one agent; K seeds' batched update
@pytest.mark.parametrize("recipe", ["2023", "nature"])
@pytest.mark.parametrize("before", [0, 1])  # a fresh agent; one with optimizer state
def test_restore_undoes_warmup_updates_exactly(monkeypatch, before, recipe, seeds):
    """A capture's warm-up undone: the parameters (for seeds, rows of the stacked tensors) and
    optimizer state back in place, and the next update the one it would have been."""
    deterministic_sampling(monkeypatch.setattr)
    one = _nature if recipe == "nature" else _agent
    make = (lambda: _seeds(one)) if seeds else one
    warmed, batch = make()
    plain, _ = make()
    for _ in range(before):
        warmed.train_step(batch)
        plain.train_step(batch)
    saved = snapshot(warmed)
    tensors = _state(warmed)
    for _ in range(3):  # what a capture's warm-up does
        warmed._update(batch)
    restore(warmed, saved)
    ptrs = [t.data_ptr() for t in _state(warmed)]
    assert ptrs[:len(tensors)] == [t.data_ptr() for t in tensors]  # the same memory, in place
    m_warmed, m_plain = warmed.train(batch), plain.train(batch)
    assert m_warmed == m_plain
    for a, b in zip(_state(warmed), _state(plain)):
        assert torch.equal(a, b)


def test_cuda_graph_needs_a_cuda_device():
    with pytest.raises(ConfigError, match="train.cuda_graph=true needs a CUDA device"):
        make_config("default", train={"cuda_graph": True}, run={"device": "cpu"})
    for make in (_agent, _nature):
        with pytest.raises(ValueError, match="needs a CUDA device"):
            make(cuda_graph=True)


# --------------------------------------------------------------------------- on a GPU


def _new_rewards(batch: dict, n: int = 4):
    """`batch` n times, with new rewards each time (seeded): a replayed graph must read its
    inputs anew at every update."""
    g = torch.Generator(device=batch["reward"].device).manual_seed(1)
    for _ in range(n):
        yield {**batch, "reward": torch.randn(batch["reward"].shape, device=g.device,
                                              generator=g)}


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("obs,gather,train", [
    pytest.param("vector", False, {}, id="vector-dense"),
    pytest.param("image", False, {}, id="image-dense"),
    pytest.param("vector", True, {}, id="vector-gather"),
    pytest.param("image", True, {}, id="image-gather"),
    # Box actions, backpropagation through the dynamics (DMC's case; the graph is CUDA's
    # default): the imagination with gradients captured too
    pytest.param("image", False, {"action": "continuous"}, id="image-continuous"),
    pytest.param("vector", False, {"action": "mixed"}, id="vector-mixed"),
    # bf16: the weight casts captured once per autocast region
    pytest.param("vector", False, {"precision": "bf16"}, id="vector-dense-bf16"),
    pytest.param("vector", False, {"compile": True}, id="vector-dense-compiled"),
    # (compiled and bf16 together: the next test)
])
def test_graphed_updates_equal_eager_updates(monkeypatch, obs, gather, train):
    """Same initial parameters, same batches, deterministic sampling: the replayed graph gives
    the eager update's losses and parameters (float rounding apart: kernels may differ; bf16
    rounds at 3 significant digits, and compiled kernels round in other places)."""
    deterministic_sampling(monkeypatch.setattr)
    torch.backends.cudnn.allow_tf32 = False
    train = dict(train)
    action = train.pop("action", "discrete")
    eager, batch = _agent(obs, action, device="cuda", onehot_gather=gather, cuda_graph=False,
                          precision=train.get("precision", "fp32"))
    graphed, _ = _agent(obs, action, device="cuda", onehot_gather=gather, cuda_graph=True,
                        **train)
    # bf16 and compiled kernels round in other places: 3% of a metric, or 0.01 near 0 (the
    # actor's loss and advantages are near 0 at the start).
    tol = {"rel": 1e-3, "abs": 1e-5} if train.get("precision", "fp32") == "fp32" else \
        {"rel": 3e-2, "abs": 1e-2}
    # Adam moves a parameter by up to ~lr per step whatever its gradient's size, so a
    # gradient near 0 whose sign differs by rounding (another cuBLAS algorithm under capture)
    # moves it 2 lr the other way: the state may differ by a few lr (1e-4); the losses,
    # which every later step depends on, are the strict check.
    _same_updates(eager, graphed, batch, tol, state_rtol=1e-3)


def _same_updates(eager, graphed, batch: dict, tol: dict, state_rtol: float) -> None:
    """Four updates on new rewards: the same metrics (within `tol`), counts and state."""
    for i, b in enumerate(_new_rewards(batch)):
        m_e, m_g = eager.train(b), graphed.train(b)
        for k in m_e:
            assert m_g[k] == pytest.approx(m_e[k], **tol), (i, k)
    assert graphed.updates == eager.updates == 4
    for a, b in zip(_state(eager), _state(graphed)):
        torch.testing.assert_close(a, b, rtol=state_rtol, atol=1e-3)


@cuda
@pytest.mark.parametrize("obs,action,train", [
    pytest.param("vector", "discrete", {}, id="vector"),
    pytest.param("image", "discrete", {"precision": "bf16"}, id="image-bf16"),
    pytest.param("vector", "discrete", {"compile": True}, id="vector-compiled"),
])
def test_graphed_nature_updates_equal_eager_ones(monkeypatch, obs, action, train):
    """The Nature recipe's update (its one loss, backward pass, LaProp step and slow critic)
    replayed as a graph gives the eager update's metrics and state, as the 2023 agent's
    (tolerances as there; discrete actions: deterministic sampling draws no numbers)."""
    deterministic_sampling(monkeypatch.setattr)
    torch.backends.cudnn.allow_tf32 = False
    precision = train.get("precision", "fp32")
    eager, batch = _nature(obs, action, device="cuda", cuda_graph=False, precision=precision)
    graphed, _ = _nature(obs, action, device="cuda", cuda_graph=True, **train)
    fp32 = precision == "fp32" and not train.get("compile")
    tol = {"rel": 1e-3, "abs": 1e-5} if fp32 else {"rel": 3e-2, "abs": 1e-2}
    _same_updates(eager, graphed, batch, tol, state_rtol=1e-3 if fp32 else 1e-2)


@cuda
def test_graphed_compiled_bf16_updates_equal_compiled_ones(monkeypatch):
    """The fastest combination on the H200: compiled, graphed, bf16 (image inputs, dense
    one-hots). Compiled bf16 kernels round in other places than eager ones, and over updates
    those differences compound: on the H200 (2026-12-04) the graphed update's metrics were
    within 3% of eager bf16's for two updates, and the critic's gradient norm 3.4% off at the
    third. So the graph is checked against the same compiled update without it (the same
    kernels; deterministic cuDNN), over four updates and at a third of that tolerance; and
    compiled against eager bf16 on the first update, from the same parameters."""
    deterministic_sampling(monkeypatch.setattr)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    fast = {"precision": "bf16", "onehot_gather": False}
    eager, batch = _agent("image", device="cuda", cuda_graph=False, **fast)
    compiled, _ = _agent("image", device="cuda", cuda_graph=False, compile=True, **fast)
    graphed, _ = _agent("image", device="cuda", cuda_graph=True, compile=True, **fast)
    for i, b in enumerate(_new_rewards(batch)):
        m_c, m_g = compiled.train(b), graphed.train(b)
        for k in m_c:
            assert m_g[k] == pytest.approx(m_c[k], rel=1e-2, abs=3e-3), (i, k)
        if i == 0:
            m_e = eager.train(b)
            for k in m_e:
                assert m_c[k] == pytest.approx(m_e[k], rel=3e-2, abs=1e-2), ("eager", k)
    assert graphed.updates == compiled.updates == 4
    for a, b in zip(_state(compiled), _state(graphed)):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3)


@cuda
@pytest.mark.parametrize("gather", [False, True])
def test_graphed_update_skips_a_nonfinite_batch_and_checks_shapes(gather):
    agent, batch = _agent(device="cuda", cuda_graph=True, onehot_gather=gather)
    agent.train(batch)
    before = [t.clone() for t in _state(agent)]
    bad = {**batch, "obs": {"vector": batch["obs"]["vector"].clone()}}
    bad["obs"]["vector"][0, 1, 0] = float("inf")
    assert agent.train(bad)["train/nonfinite_steps"] == 3
    for a, b in zip(_state(agent), before):
        assert torch.equal(a, b)
    assert agent.train(batch)["train/nonfinite_steps"] == 0
    assert not all(torch.equal(a, b) for a, b in zip(_state(agent), before))
    short = {k: (v if k == "obs" else v[:, :4]) for k, v in batch.items()}
    short["obs"] = {"vector": batch["obs"]["vector"][:, :4]}
    with pytest.raises(ValueError, match="replays one batch shape"):
        agent.train(short)


@cuda
def test_an_update_that_reads_the_host_names_the_fix_when_captured(monkeypatch):
    """A network that reads a value back to the host (here the critic's, via .item()) runs
    eagerly but cannot be captured: the error says why and names train.cuda_graph=false."""
    agent, batch = _agent(device="cuda", cuda_graph=True)
    net = agent.critic.net
    real = net.forward
    monkeypatch.setattr(net, "forward",
                        lambda x: real(x) if x.sum().item() is not None else None, raising=False)
    with pytest.raises(RuntimeError, match="could not capture the update .*"
                                           "train.cuda_graph=false runs the same update"):
        agent.train(batch)


@cuda
def test_checkpoints_keep_the_gpus_random_state():
    from lucid.checkpoint import rng_state, set_rng_state
    torch.randn(3, device="cuda")
    saved = rng_state()
    assert "cuda" in saved
    first = torch.randn(5, device="cuda")
    torch.randn(7, device="cuda")
    set_rng_state(saved)
    assert torch.equal(torch.randn(5, device="cuda"), first)


# ---------------------------------------------------------------- K seeds' batched update

def _seeds(make, k: int = 2, vmap: bool | None = True, **train):
    """K agents of `make` (`_agent` or `_nature`), seeds 0..K-1, as one batched update
    (`vmap`; None: the device's choice), and a stacked batch whose seeds differ in their
    rewards."""
    from lucid.batched import BatchedAgents, stack_batches
    pairs = [make(seed=s, **train) for s in range(k)]
    batches = [{**b, "reward": b["reward"] + s} for s, (_, b) in enumerate(pairs)]
    return BatchedAgents([a for a, _ in pairs], vmap=vmap), stack_batches(batches)


@pytest.mark.parametrize("recipe", ["2023", "nature"])
def test_the_batched_update_of_seeds_reads_nothing_back_to_the_host(recipe):
    """What lets K seeds' batched update (lucid.batched) be captured as one graph: the vmapped
    steps and each seed's own clipping, skip and optimizer step stay on the device."""
    batched, batch = _seeds(_nature if recipe == "nature" else _agent)
    batched.train_step(batch)
    batch["reward"][1, 0, 2] = float("nan")  # seed 1's steps are skipped, on the device
    with HostReads() as probe:
        metrics = batched.train_step(batch)
    assert not probe.seen, "host reads in the batched update:\n" + "\n".join(
        f"{k}:\n{v}" for k, v in probe.seen.items())
    assert metrics["train/nonfinite_steps"].tolist() == [0.0, 1.0]
    assert [a.updates for a in batched.agents] == [2, 2]


@cuda
@pytest.mark.parametrize("recipe,train", [
    pytest.param("2023", {}, id="2023"),
    pytest.param("2023", {"compile": True}, id="compiled_seeds"),
    pytest.param("nature", {}, id="nature"),
])
def test_graphed_batched_seeds_equal_the_eager_batched_update(monkeypatch, recipe, train):
    """K seeds' batched update captured as one graph (train.cuda_graph; a GPU batches the
    seeds under it by default) gives each seed the eager batched update's metrics and state,
    over four updates, at the tolerances of one agent's graph
    (`test_graphed_updates_equal_eager_updates`); compiled, at the compiled ones'. A seed
    loaded from a checkpoint afterwards (its optimizer state replaced) is captured anew."""
    import copy
    deterministic_sampling(monkeypatch.setattr)
    torch.backends.cudnn.allow_tf32 = False
    make = _nature if recipe == "nature" else _agent
    eager, batch = _seeds(make, 3, device="cuda", cuda_graph=False)
    graphed, _ = _seeds(make, 3, vmap=None, device="cuda", cuda_graph=True, **train)
    assert graphed.vmap
    fp32 = not train.get("compile")
    tol = {"rel": 1e-3, "abs": 1e-5} if fp32 else {"rel": 3e-2, "abs": 1e-2}
    saved = None
    for i, b in enumerate(_new_rewards(batch, 6)):
        if i == 2:
            saved = copy.deepcopy(eager.agents[1].state_dict())
        if i == 4:  # seed 1 back to its state of update 2, in both
            eager.agents[1].load_state_dict(copy.deepcopy(saved))
            graphed.agents[1].load_state_dict(copy.deepcopy(saved))
        rows_e, rows_g = eager.train(b), graphed.train(b)
        assert len(rows_e) == len(rows_g) == 3
        for k, (m_e, m_g) in enumerate(zip(rows_e, rows_g)):
            for name in m_e:
                assert m_g[name] == pytest.approx(m_e[name], **tol), (i, k, name)
    assert graphed._graph is not None
    assert [a.updates for a in graphed.agents] == [a.updates for a in eager.agents]
    for a, b in zip(_state(eager), _state(graphed)):
        torch.testing.assert_close(a, b, rtol=1e-3 if fp32 else 1e-2, atol=1e-3)
