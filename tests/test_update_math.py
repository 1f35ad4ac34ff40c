"""The assembly of one `Agent.train` update (lucid/agent.py), recomputed independently.

The pieces (λ-returns, loss weights, return normalization, actor and critic losses, heads)
are unit-tested elsewhere; these tests check that `Agent._update` puts them together as
docs/algorithm.md says. During a real update they capture the imagined trajectory (features
of steps 0..H and the actions) and copies of the heads as they were when it was imagined,
evaluate the heads on those features, and redo everything after that in float64 numpy loops
that share no code with lucid's behavior functions:

* rewards r_t = two-hot mean of the reward head at step t (t = 1..H; step 0's is unused);
* continues c_t = [continue logit > 0] (t = 1..H), c_0 = 1 - is_terminal of the start;
* values v_t = two-hot mean of the (fast) critic at steps 0..H;
* λ-returns R_H = v_H, R_t = r_{t+1} + γ c_{t+1} ((1 - λ) v_{t+1} + λ R_{t+1}), real space;
* weights w_t = prod_{i<=t} (γ c_i) / γ for t = 0..H-1;
* return scale S = max(1, high - low), the 5th/95th percentiles' EMA (0.99) updated by this
  batch's returns before use;
* actor loss -mean(w_t (log π(a_t | s_t) sg((R_t - v_t) / S) + η H[π(s_t)])) (REINFORCE,
  discrete) or -mean(w_t ((R_t - v_t) / S + η H[π(s_t)])) (Box, through the dynamics);
* critic loss mean(w_t (CE(twohot(symlog R_t)) + slow_critic_reg CE(twohot(symlog v^slow_t)))).

Gradient clipping is checked through the parameter change of the first Adam step, which
is -lr g_c / (|g_c| + eps) elementwise for the clipped gradient g_c.
"""

from __future__ import annotations

import copy
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from lucid.agent import Agent
from lucid.behavior import replay_critic_loss
from lucid.config import make_config
from lucid.specs import ActionSpec, ObsSpec
from lucid.nets import OneHotCat
from numpy_ref import (BINS, loop_imagined_weights, loop_lambda_return, np_log_softmax,
                       np_symlog, np_twohot, np_twohot_ce, np_twohot_mean, t2n)

VEC = ObsSpec(vectors={"vector": 4})
DISCRETE = ActionSpec.from_space(gym.spaces.Discrete(3))
BOX = ActionSpec.from_space(gym.spaces.Box(-1.0, 1.0, (2,), np.float32))

# Non-default constants, so that a swapped or dropped constant changes the numbers.
GAMMA, LAM, ETA, SLOW_REG = 0.9, 0.7, 0.05, 0.4
H = 5
# The return normalizer's EMA before the update (as if after earlier updates): S > 1.
LOW0, HIGH0 = -3.0, 4.0


# --------------------------------------------------------------------------- setup


def make_agent(act: ActionSpec, seed: int, **train) -> Agent:
    torch.manual_seed(seed)
    settings = dict(horizon=H, gamma=GAMMA, lam=LAM, entropy=ETA, slow_critic_reg=SLOW_REG)
    settings.update(train)
    config = make_config(model={"size": "nano"}, train=settings)
    agent = Agent(VEC, act, config)
    with torch.no_grad():
        # Rewards and values that vary with the state (the output layers start at zero), a
        # slow critic unlike the fast one, continue logits of both signs.
        agent.wm.reward.out.weight.normal_(0, 0.5)
        agent.critic.net.out.weight.normal_(0, 0.5)
        agent.critic.net.out.bias.normal_(0, 0.5)
        agent.critic.slow.out.weight.normal_(0, 0.5)
        agent.critic.slow.out.bias.normal_(0, 0.5)
        agent.wm.cont.out.weight.mul_(5.0)
        agent.retnorm.low.fill_(LOW0)
        agent.retnorm.high.fill_(HIGH0)
    return agent


def make_batch(act: ActionSpec, B=3, T=6, seed=0):
    """A replayed (B, T) batch; about a third of the steps (not the first) are terminal, and
    some others truncated (is_last without is_terminal)."""
    g = torch.Generator().manual_seed(seed)
    if act.is_discrete:
        (n,) = act.discrete
        action = torch.eye(n)[torch.randint(0, n, (B, T), generator=g)]
    else:
        action = torch.rand(B, T, act.dim, generator=g) * 2 - 1
    is_first = torch.zeros(B, T, dtype=torch.bool)
    is_first[:, 0] = True
    is_terminal = torch.rand(B, T, generator=g) < 0.35
    is_terminal[:, 0] = False
    truncated = (torch.rand(B, T, generator=g) < 0.2) & ~is_terminal  # ends, yet continue
    truncated[:, 0] = False
    return {
        "obs": {"vector": torch.randn(B, T, 4, generator=g) * 2},
        "action": action,
        "reward": torch.randn(B, T, generator=g),
        "is_first": is_first,
        "is_terminal": is_terminal,
        "is_last": is_terminal | truncated,
    }


def dense(feat) -> torch.Tensor:
    return feat.to_dense() if isinstance(feat, OneHotCat) else feat


def capture_imagination(agent: Agent, monkeypatch) -> dict:
    """Wrap the world model's imagination (`imagine_no_grad` for REINFORCE, `imagine` through the
    dynamics) to record its features (H+1, N, F) and actions (H, N, A), and copies of the
    reward and continue heads, the actor and both critics as they were at that moment (after
    the world model's step, before the actor's and the critic's)."""
    rec = {}

    def wrap(fn):
        def wrapped(*args, **kwargs):
            feat, action = fn(*args, **kwargs)
            rec["feat"] = dense(feat).detach().clone()
            rec["action"] = action.detach().clone()
            rec["nets"] = copy.deepcopy({"reward": agent.wm.reward, "cont": agent.wm.cont,
                                         "actor": agent.actor.head, "critic": agent.critic.net,
                                         "slow": agent.critic.slow})
            return feat, action
        return wrapped

    monkeypatch.setattr(agent.wm, "imagine_no_grad", wrap(agent.wm.imagine_no_grad))
    monkeypatch.setattr(agent.wm, "imagine", wrap(agent.wm.imagine))
    return rec


def expected_update(rec: dict, batch: dict, act: ActionSpec, ema=(LOW0, HIGH0), unimix=0.01,
                    min_std=0.1, max_std=1.0, box_reinforce=False) -> dict:
    """Every imagination metric of the update, from the captured trajectory, in numpy;
    `ema`: the return normalizer's (low, high) before the update; `box_reinforce`: Box
    actions learn by REINFORCE (train.continuous_grad=reinforce)."""
    nets, feat = rec["nets"], rec["feat"]
    with torch.no_grad():
        heads = {k: t2n(m(feat)) for k, m in nets.items()}
    nb = len(BINS)
    reward = np_twohot_mean(heads["reward"][..., :nb])       # (H+1, N); row 0 unused
    cont_logit = heads["cont"][..., 0]                        # (H+1, N)
    value = np_twohot_mean(heads["critic"][..., :nb])         # (H+1, N)
    slow = np_twohot_mean(heads["slow"][..., :nb])            # (H+1, N)
    critic_logits = heads["critic"][..., :nb]
    N = feat.shape[1]
    assert reward.shape == (H + 1, N)

    # a logit this far from 0 has the same sign on the gathered and the dense features
    assert np.abs(cont_logit[1:]).min() > 1e-4, "a continue logit too close to 0 to call"
    cont = np.zeros((H + 1, N))
    cont[0] = 1.0 - t2n(batch["is_terminal"].reshape(-1))     # starts in B-major order
    for t in range(1, H + 1):
        cont[t] = (cont_logit[t] > 0).astype(np.float64)

    ret = loop_lambda_return(reward, cont, value, GAMMA, LAM)  # (H, N)
    weight = loop_imagined_weights(cont, GAMMA)[:H]

    low = 0.99 * ema[0] + 0.01 * np.percentile(ret, 5)   # numpy's default: linear
    high = 0.99 * ema[1] + 0.01 * np.percentile(ret, 95)  # interpolation, as torch.quantile
    scale = max(1.0, high - low)
    adv = (ret - value[:H]) / scale

    x = heads["actor"][:H]
    action = t2n(rec["action"])
    if act.is_discrete:  # unimix categorical, REINFORCE
        probs = (1 - unimix) * np.exp(np_log_softmax(x)) + unimix / x.shape[-1]
        logp = (np.log(probs) * action).sum(-1)
        ent = -(probs * np.log(probs)).sum(-1)
        objective = logp * adv
    else:  # Normal(tanh mean, std in [min, max]): REINFORCE, or the return's gradient
        mean_raw, std_raw = np.split(x, 2, -1)  # through the dynamics
        std = (max_std - min_std) / (1 + np.exp(-(std_raw + 2.0))) + min_std
        ent = (0.5 * np.log(2 * np.pi * np.e * std ** 2)).sum(-1)
        z = (action - np.tanh(mean_raw)) / std
        logp = (-0.5 * z ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)).sum(-1)
        objective = logp * adv if box_reinforce else adv
    a_loss = -(weight * (objective + ETA * ent)).mean()

    l_ret = np_twohot_ce(critic_logits[:H], ret)
    l_reg = np_twohot_ce(critic_logits[:H], slow[:H])
    c_loss = (weight * (l_ret + SLOW_REG * l_reg)).mean()

    return {
        "world_model/imagined_reward_mean": reward[1:].mean(),
        "world_model/imagined_continue_mean": cont.mean(),
        "critic/value_mean": value[:H].mean(),
        "critic/return_mean": ret.mean(),
        "actor/return_low": low,
        "actor/return_high": high,
        "actor/return_scale": scale,
        "actor/advantage_mag": np.abs(adv).mean(),
        "actor/entropy": ent.mean(),
        "actor/loss": a_loss,
        "critic/return_loss": l_ret.mean(),
        "critic/slow_reg": l_reg.mean(),
        "critic/loss": c_loss,
        "_cont": cont,
        "_weight": weight,
        "_ret": ret,
        "_adv": adv,
    }


def assert_metrics_match(metrics: dict, want: dict):
    bad = {}
    for key, value in want.items():
        if key.startswith("_"):
            continue
        got = metrics[key]
        if not np.isclose(got, value, rtol=2e-5, atol=1e-6):
            bad[key] = (got, value)
    assert not bad, "agent metric != numpy (got, want): " + repr(bad)


# --------------------------------------------------------------------------- the losses


@pytest.mark.parametrize("act,grad", [(DISCRETE, "dynamics"), (BOX, "dynamics"),
                                      (BOX, "reinforce")],
                         ids=["discrete-reinforce", "box-dynamics", "box-reinforce"])
def test_update_metrics_match_a_numpy_recomputation_of_the_imagination(act, grad, monkeypatch):
    """Independent computation: from the captured imagined features and actions and the heads
    as they were when imagining, numpy loops rebuild rewards (reward head at steps 1..H),
    continues (mode of the continue head; step 0 = 1 - is_terminal of the start), fast-critic
    values, λ-returns with γ = train.gamma and λ = train.lam, weights prod(γ c)/γ, the
    percentile EMA scale (updated before use, from a non-zero EMA so that S > 1), the actor
    loss (REINFORCE for Discrete, for Box the dynamics objective, or with
    train.continuous_grad=reinforce REINFORCE of the Normal's log-density) with its entropy
    bonus, and the critic loss (toward the returns plus slow_critic_reg times toward the slow
    critic). Every imagination metric Agent.train reports must equal them."""
    agent = make_agent(act, seed=11, continuous_grad=grad)
    rec = capture_imagination(agent, monkeypatch)
    batch = make_batch(act, seed=5)
    torch.manual_seed(3)
    metrics = agent.train(batch)
    want = expected_update(rec, batch, act, box_reinforce=grad == "reinforce")

    # the setup exercises what it means to check: terminal starts, imagined ends, S > 1
    cont = want["_cont"]
    assert 0 < cont[0].sum() < cont.shape[1]
    assert 0 < cont[1:].sum() < cont[1:].size
    assert want["actor/return_scale"] > 2.0
    assert metrics["train/nonfinite_steps"] == 0
    assert_metrics_match(metrics, want)


def test_the_update_runs_from_the_updated_world_model_and_a_zero_return_ema(monkeypatch):
    """Independent computation as above, with a world-model learning rate > 0 and the return
    normalizer fresh (EMA of 0): the heads copied at imagination time are the world model's
    after its step, and S = max(1, 0.01 (P95 - P5)) is the floor 1 here."""
    agent = make_agent(DISCRETE, seed=12, model_lr=1e-3)
    with torch.no_grad():
        agent.retnorm.low.zero_()
        agent.retnorm.high.zero_()
    rec = capture_imagination(agent, monkeypatch)
    batch = make_batch(DISCRETE, seed=6)
    reward_before = copy.deepcopy(agent.wm.reward)
    torch.manual_seed(4)
    metrics = agent.train(batch)
    # the world model did move before imagining
    assert any(not torch.equal(a, b) for a, b in zip(reward_before.parameters(),
                                                     rec["nets"]["reward"].parameters()))
    want = expected_update(rec, batch, DISCRETE, ema=(0.0, 0.0))
    assert want["actor/return_scale"] == 1.0
    assert_metrics_match(metrics, want)


def test_the_critic_and_actor_gradients_are_those_of_the_weighted_losses(monkeypatch):
    """Independent computation of the output layers' gradients (recorded as backward
    accumulates them, before clipping), from the numpy returns, weights and scale:

    * critic: d/dlogits mean(w_t (CE_ret + reg CE_slow)) = w_t ((p - twohot(symlog R_t))
      + reg (p - twohot(symlog v^slow_t))) / (H N);
    * discrete actor (REINFORCE, unimix u): with s = softmax(x), π = (1 - u) s + u / K,
      dπ_k/dx_j = (1 - u) s_k (δ_kj - s_j); d/dx_j of -mean(w_t (log π_a sg(A_t) + η H[π]))
      = -w_t (A_t dπ_a/dx_j / π_a - η Σ_k (log π_k + 1) dπ_k/dx_j) / (H N);

    each pushed back through the layer (bias: the sum; weight: outer product with the head's
    MLP features, recomputed on the captured states)."""
    agent = make_agent(DISCRETE, seed=13)
    rec = capture_imagination(agent, monkeypatch)
    grads = {}
    for net, layer in (("critic", agent.critic.net.out), ("actor", agent.actor.head.out)):
        for name in ("bias", "weight"):
            getattr(layer, name).register_post_accumulate_grad_hook(
                lambda p, key=(net, name): grads.__setitem__(key, t2n(p.grad).copy()))
    batch = make_batch(DISCRETE, seed=7)
    torch.manual_seed(5)
    metrics = agent.train(batch)
    want = expected_update(rec, batch, DISCRETE)
    assert_metrics_match(metrics, want)

    nb = len(BINS)
    feat = rec["feat"][:H]
    N = feat.shape[1]
    w = want["_weight"][..., None]
    with torch.no_grad():
        hidden = {k: t2n(rec["nets"][k].mlp(feat)) for k in ("critic", "actor")}  # (H, N, U)
        logits = t2n(rec["nets"]["critic"](feat))[..., :nb]
        slow = np_twohot_mean(t2n(rec["nets"]["slow"](feat))[..., :nb])
        x = t2n(rec["nets"]["actor"](feat))
    ret = want["_ret"]
    p = np.exp(np_log_softmax(logits))
    d_critic = w * ((p - np_twohot(np_symlog(ret))) + SLOW_REG * (p - np_twohot(np_symlog(slow))))
    d_critic /= H * N

    u, K = 0.01, x.shape[-1]
    s = np.exp(np_log_softmax(x))
    pi = (1 - u) * s + u / K
    dpi = (1 - u) * s[..., :, None] * (np.eye(K) - s[..., None, :])  # [..., k, j] = dπ_k/dx_j
    a = t2n(rec["action"])
    dlogp_a = np.einsum("tnk,tnkj->tnj", a / pi, dpi)
    dent = -np.einsum("tnk,tnkj->tnj", np.log(pi) + 1, dpi)
    adv = want["_adv"][..., None]
    d_actor = -w * (adv * dlogp_a + ETA * dent) / (H * N)

    for net, d in (("critic", d_critic), ("actor", d_actor)):
        k = d.shape[-1]
        for name, want_grad in (("bias", d.sum((0, 1))),
                                ("weight", np.einsum("tnk,tnu->ku", d, hidden[net]))):
            # float32 sums of many terms: tolerance relative to the largest element
            np.testing.assert_allclose(grads[net, name][:k], want_grad, rtol=1e-4,
                                       atol=1e-4 * np.abs(want_grad).max(),
                                       err_msg=f"{net} {name}")


def test_replay_critic_loss_by_hand():
    """The Nature recipe's replay value loss: the critic at replayed states 0..T-2 (step T-1
    has no return) toward their λ-returns plus slow_critic_reg times toward the slow critic,
    weight 0 at steps that end an episode, the mean over all B·(T-1) steps; the states carry
    no gradient back (into the world model)."""
    agent = make_agent(DISCRETE, seed=14)
    B, T, F = 3, 6, agent.critic.net.mlp.net[0].in_features
    g = torch.Generator().manual_seed(0)
    feat = torch.randn(B, T, F, generator=g).requires_grad_()
    ret = torch.randn(B, T - 1, generator=g) * 5
    last = torch.zeros(B, T, dtype=torch.bool)
    last[0, 2] = last[2, 0] = last[1, T - 1] = True
    loss, metrics = replay_critic_loss(agent.critic, feat, ret, last, agent.config.train)
    nb = len(BINS)
    with torch.no_grad():
        logits = t2n(agent.critic.net(feat[:, :-1]))[..., :nb]
        slow = np_twohot_mean(t2n(agent.critic.slow(feat[:, :-1]))[..., :nb])
    w = 1.0 - t2n(last[:, :-1]).astype(np.float64)
    want = (w * (np_twohot_ce(logits, t2n(ret)) + SLOW_REG * np_twohot_ce(logits, slow))).mean()
    np.testing.assert_allclose(loss.item(), want, rtol=1e-5)
    assert metrics["critic/replay_loss"] is loss
    loss.backward()
    assert feat.grad is None and agent.critic.net.out.weight.grad is not None


def test_the_replay_value_loss_of_an_update_and_its_share_of_the_critic_gradient(monkeypatch):
    """train.replay_value_scale > 0 (the Nature recipe), independent computation from the
    replayed posterior features, the batch and the imagined λ-returns (numpy loops):

    * ends e_t: is_last, or the next step is_first (a seam without is_last);
    * bootstrap b_t = the imagined λ-return at step 0 of the imagination from replayed step t;
    * R_{T-1} = b_{T-1}, R_t = r_{t+1} + γ (1 - term_{t+1}) ((1 - λ'_{t+1}) b_{t+1}
      + λ' R_{t+1}) with λ'_{t+1} = λ (1 - e_{t+1});
    * replay loss = mean over B (T-1) of (1 - e_t) (CE(twohot(symlog R_t))
      + slow_critic_reg CE(twohot(symlog v^slow_t))), the critic at the replayed states;

    the reported replay loss must equal it, and the critic's gradient norm must be that of
    the imagined critic loss plus replay_value_scale times it (autograd through a copy of
    the critic toward these numpy targets)."""
    scale, nb = 0.3, len(BINS)
    agent = make_agent(DISCRETE, seed=16, replay_value_scale=scale)
    rec = capture_imagination(agent, monkeypatch)
    wm_loss = agent.wm.loss

    def record_loss(*args, **kwargs):
        loss, metrics, out = wm_loss(*args, **kwargs)
        rec["replay_feat"] = dense(out["feat"]).detach().clone()
        return loss, metrics, out

    monkeypatch.setattr(agent.wm, "loss", record_loss)
    batch = make_batch(DISCRETE, seed=9)
    batch["is_first"][2, 3] = True  # a seam: step 2 ends an episode without is_last
    torch.manual_seed(7)
    metrics = agent.train(batch)
    want = expected_update(rec, batch, DISCRETE)
    assert_metrics_match(metrics, want)

    rep_ret, end = replay_targets(batch, want)
    term = t2n(batch["is_terminal"])
    # the setup exercises the cases: terminal steps, truncations, the seam
    assert 0 < term[:, 1:].sum() < end[:, 1:].sum()
    assert end[2, 2] == 1 and not batch["is_last"][2, 2]
    critic, slow = rec["nets"]["critic"], rec["nets"]["slow"]
    feat_rep = rec["replay_feat"][:, :-1]
    with torch.no_grad():
        slow_rep = np_twohot_mean(t2n(slow(feat_rep))[..., :nb])
    w_rep = 1.0 - end[:, :-1]
    logits = t2n(critic(feat_rep).detach())[..., :nb]
    r_loss = (w_rep * (np_twohot_ce(logits, rep_ret)
                       + SLOW_REG * np_twohot_ce(logits, slow_rep))).mean()
    np.testing.assert_allclose(metrics["critic/replay_loss"], r_loss, rtol=2e-5)

    total = (imagined_critic_loss(rec, want)
             + scale * weighted_ce(critic(feat_rep), w_rep, rep_ret, slow_rep))
    total.backward()
    np.testing.assert_allclose(metrics["critic/grad_norm"], grad_norm(critic), rtol=1e-4)


def replay_targets(batch: dict, want: dict) -> tuple[np.ndarray, np.ndarray]:
    """numpy loops: the replayed λ-returns R (B, T-1) bootstrapped from the imagined returns
    at step 0 (`want["_ret"][0]`, B-major), and the episode ends e (B, T)."""
    B, T = batch["reward"].shape
    reward, term = t2n(batch["reward"]), t2n(batch["is_terminal"])
    end = t2n(batch["is_last"])
    end[:, :-1] = np.maximum(end[:, :-1], t2n(batch["is_first"])[:, 1:])
    boot = want["_ret"][0].reshape(B, T)
    rep_ret = np.zeros((B, T - 1))
    for b in range(B):
        R = boot[b, T - 1]
        for t in reversed(range(T - 1)):
            lam = LAM * (1.0 - end[b, t + 1])
            R = reward[b, t + 1] + GAMMA * (1.0 - term[b, t + 1]) * (
                (1.0 - lam) * boot[b, t + 1] + lam * R)
            rep_ret[b, t] = R
    return rep_ret, end


def weighted_ce(x: torch.Tensor, w: np.ndarray, ret: np.ndarray, slow_v: np.ndarray):
    """mean(w (CE(x, twohot(symlog ret)) + slow_critic_reg CE(x, twohot(symlog slow_v))))
    in float64 torch (for autograd), the logits x cut to the real bins."""
    def ce(target):
        probs = torch.from_numpy(np_twohot(np_symlog(target)))
        return -(probs * torch.log_softmax(x[..., :len(BINS)].double(), -1)).sum(-1)
    return (torch.from_numpy(w) * (ce(ret) + SLOW_REG * ce(slow_v))).mean()


def imagined_critic_loss(rec: dict, want: dict) -> torch.Tensor:
    """The critic loss on the captured imagination, through the captured critic's copy."""
    critic, slow = rec["nets"]["critic"], rec["nets"]["slow"]
    with torch.no_grad():
        slow_im = np_twohot_mean(t2n(slow(rec["feat"][:H]))[..., :len(BINS)])
    return weighted_ce(critic(rec["feat"][:H]), want["_weight"], want["_ret"], slow_im)


def grad_norm(module: torch.nn.Module) -> float:
    return float(np.sqrt(sum(float((p.grad.double() ** 2).sum())
                             for p in module.parameters() if p.grad is not None)))


@pytest.mark.parametrize("act", [DISCRETE, BOX], ids=["reinforce", "box-dynamics"])
def test_replay_value_grad_trains_the_world_model_from_the_parameters_before_the_update(
        act, monkeypatch):
    """train.replay_value_grad (the authors' Nature code, repval_grad): the world model's
    gradient is that of L_wm + replay_value_scale · L_replay, where L_replay is the critic's
    replay value loss at the replayed posterior features with their gradient kept, and
    imagination runs on the world model as it was before the update (one set of parameters
    for every loss, as with a single optimizer). Independent computation: a copy of the world
    model taken before the update redoes its loss on the batch with the same random draws;
    the replayed λ-returns come from numpy loops (`replay_targets`); autograd of the sum
    through the copies gives the gradients the update must have used. A Box actor learns
    through the dynamics while the world model's graph waits for its backward pass."""
    scale = 0.3
    agent = make_agent(act, seed=17, replay_value_scale=scale, replay_value_grad=True)
    wm0 = copy.deepcopy(agent.wm)
    rec = capture_imagination(agent, monkeypatch)
    grads = {}
    for name, p in agent.wm.named_parameters():
        p.register_post_accumulate_grad_hook(
            lambda p, name=name: grads.__setitem__(name, p.grad.detach().double().clone()))
    batch = make_batch(act, seed=9)
    torch.manual_seed(7)
    metrics = agent.train(batch)

    # imagination saw the heads before the update, and the update changed them
    for head in ("reward", "cont"):
        for p0, p_im, p1 in zip(getattr(wm0, head).parameters(),
                                rec["nets"][head].parameters(),
                                getattr(agent.wm, head).parameters()):
            assert torch.equal(p0, p_im) and not torch.equal(p0, p1), head
    want = expected_update(rec, batch, act)
    assert_metrics_match(metrics, want)

    torch.manual_seed(7)  # the world model's loss draws first in an update
    wm_loss, wm_metrics, out = wm0.loss(batch, agent.config.train)
    assert wm_loss.item() == pytest.approx(metrics["world_model/loss"], rel=1e-6)
    rep_ret, end = replay_targets(batch, want)
    critic, slow = rec["nets"]["critic"], rec["nets"]["slow"]
    feat_rep = out["feat"][:, :-1]
    with torch.no_grad():
        slow_rep = np_twohot_mean(t2n(slow(feat_rep))[..., :len(BINS)])
    r_loss = weighted_ce(critic(feat_rep), 1.0 - end[:, :-1], rep_ret, slow_rep)
    assert r_loss.item() == pytest.approx(metrics["critic/replay_loss"], rel=2e-5)

    wm_loss.backward(retain_graph=True)
    alone = {n: p.grad.double().clone() for n, p in wm0.named_parameters()
             if p.grad is not None}
    (imagined_critic_loss(rec, want) + scale * r_loss).backward()
    np.testing.assert_allclose(metrics["world_model/grad_norm"], grad_norm(wm0), rtol=1e-4)
    np.testing.assert_allclose(metrics["critic/grad_norm"], grad_norm(critic), rtol=1e-4)
    assert grads.keys() == {n for n, p in wm0.named_parameters() if p.grad is not None}
    moved = []
    for name, p in wm0.named_parameters():
        if p.grad is None:
            continue
        g = p.grad.double()
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-5 * g.abs().max().item(),
                                   msg=name)
        if (g - alone[name]).abs().max() > 1e-3 * g.abs().max():
            moved.append(name.split(".")[0])
    # the replay value loss reaches the encoder and the posterior's path through the RSSM,
    # not the prior, the decoder or the heads
    assert {"encoder", "post_mlp", "post_out", "seq_in", "gru"} <= set(moved), moved
    assert not {"prior_mlp", "prior_out", "decoder", "reward", "cont"} & set(moved), moved


def test_a_box_actors_entropy_gradient_holds_the_imagined_states_fixed(monkeypatch):
    """The actor sees sg(feat): with the reward and critic outputs at their zero
    initialization (returns, values and their gradients 0), a Box actor's loss through the
    dynamics is -mean(w_t η H[π(sg s_t)]), so its gradient is that of the entropy bonus at the
    imagined states held fixed; none reaches the actor through the states its earlier
    actions led to. Independent computation: autograd of the closed-form Normal entropy
    (std = (max - min) sigmoid(x + 2) + min) of a copy of the actor head on the captured
    states, weighted by the numpy weights."""
    torch.manual_seed(16)
    config = make_config(model={"size": "nano"},
                         train=dict(horizon=H, gamma=GAMMA, lam=LAM, entropy=ETA,
                                    slow_critic_reg=SLOW_REG))
    agent = Agent(VEC, BOX, config)  # reward and critic outputs as initialized: zero
    with torch.no_grad():
        agent.wm.cont.out.weight.mul_(5.0)  # continue logits of both signs, far from 0
    rec = capture_imagination(agent, monkeypatch)
    grads = {}
    for name, p in agent.actor.head.named_parameters():
        p.register_post_accumulate_grad_hook(
            lambda p, name=name: grads.__setitem__(name, p.grad.detach().double().clone()))
    batch = make_batch(BOX, seed=10)
    torch.manual_seed(8)
    metrics = agent.train(batch)
    want = expected_update(rec, batch, BOX, ema=(0.0, 0.0))
    assert_metrics_match(metrics, want)
    assert abs(metrics["critic/return_mean"]) < 1e-4 and abs(metrics["critic/value_mean"]) < 1e-4

    head = rec["nets"]["actor"]
    std_raw = head(rec["feat"][:H]).double().chunk(2, -1)[1]
    std = (1.0 - 0.1) * torch.sigmoid(std_raw + 2.0) + 0.1
    ent = (0.5 * torch.log(2 * math.pi * math.e * std ** 2)).sum(-1)
    (-(torch.from_numpy(want["_weight"]) * ETA * ent).mean()).backward()
    assert set(grads) == {n for n, _ in head.named_parameters()}
    for name, p in head.named_parameters():
        g = p.grad.double()
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-4 * g.abs().max().item(),
                                   msg=name)


# --------------------------------------------------------------------------- clipping


@pytest.mark.parametrize("act", [DISCRETE, BOX], ids=["discrete", "box"])
def test_each_optimizer_steps_on_its_own_globally_clipped_gradient(act):
    """Independent computation: with clips far below the gradients' norms, each component's
    gradient g is recorded as backward accumulates it (before clipping); its global norm
    |g| must be the reported grad_norm, the clipped gradient is g_c = g · clip / (|g| + 1e-6),
    and the first Adam step moves every parameter by exactly -lr g_c / (|g_c| + eps)
    (m̂ = g_c, v̂ = g_c²). Unclipped, that step would be ≈ -lr sign(g): ten times as large.
    Each component has a clip and an eps of its own (train.model_clip, actor_clip,
    critic_clip; model_eps, actor_eps, critic_eps), all different, so that one optimizer
    stepping with another's setting changes its step."""
    lr = 1e-2
    clips = {"world_model": 1e-6, "actor": 4e-6, "critic": 2e-6}
    epss = {"world_model": 1e-5, "actor": 3e-5, "critic": 2e-5}
    prefix = {"world_model": "model", "actor": "actor", "critic": "critic"}
    settings = {f"{prefix[g]}_{name}": value[g] for g in prefix
                for name, value in (("clip", clips), ("eps", epss))}
    agent = make_agent(act, seed=14, model_lr=lr, actor_lr=lr, critic_lr=lr, **settings)
    groups = {"world_model": agent.wm, "actor": agent.actor, "critic": agent.critic.net}
    grads = {k: {} for k in groups}
    before = {}
    for g, module in groups.items():
        for name, p in module.named_parameters():
            before[g, name] = t2n(p).copy()
            p.register_post_accumulate_grad_hook(
                lambda p, g=g, name=name: grads[g].__setitem__(name, t2n(p.grad).copy()))
    torch.manual_seed(6)
    metrics = agent.train(make_batch(act, seed=8))
    assert metrics["train/nonfinite_steps"] == 0
    for g, module in groups.items():
        clip, eps = clips[g], epss[g]
        assert set(grads[g]) == {n for n, _ in module.named_parameters()}
        norm = np.sqrt(sum((x ** 2).sum() for x in grads[g].values()))
        assert norm > 1e3 * clip, g  # the clip is active
        np.testing.assert_allclose(metrics[f"{g}/grad_norm"], norm, rtol=1e-4)
        coef = clip / (norm + 1e-6)
        for name, p in module.named_parameters():
            g_c = grads[g][name] * coef
            want = -lr * g_c / (np.abs(g_c) + eps)
            np.testing.assert_allclose(t2n(p) - before[g, name], want, rtol=0, atol=2e-6,
                                       err_msg=f"{g}.{name}")
