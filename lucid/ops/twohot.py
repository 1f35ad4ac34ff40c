"""The two-hot cross-entropy's speed path: `TwoHot.losses` (lucid.nets) calls `twohot_nll`
instead of autograd through log_softmax and gather (its plain twin, `twohot_nll_plain`,
which tests/test_fast_paths.py compares it with)."""

from __future__ import annotations

import torch


def twohot_nll(logits: torch.Tensor, probs: torch.Tensor, lse: torch.Tensor,
               below: torch.Tensor, w_above: torch.Tensor) -> torch.Tensor:
    """-(1 - w) log p[below] - w log p[below + 1] for n targets (n, ...) of the same logits
    (..., bins): `below` the bin under each target, `w_above` the weight of the one above,
    `probs` softmax(logits) and `lse` logsumexp(logits) (..., 1), both without gradient.
    Compiled, the plain form: a graph fuses its passes itself, and `TwoHotNLL`'s generated
    vmap rule gives wrong gradients when compiled under vmap (several seeds:
    tests/test_batched.py)."""
    if torch.compiler.is_compiling():
        return twohot_nll_plain(logits, below, w_above)
    return TwoHotNLL.apply(logits, probs, lse, below, w_above)


def twohot_nll_plain(logits: torch.Tensor, below: torch.Tensor,
                     w_above: torch.Tensor) -> torch.Tensor:
    """`twohot_nll` by autograd through log_softmax and gather."""
    logp = torch.log_softmax(logits, -1).unsqueeze(0).expand(below.shape[0], *logits.shape)
    picked = torch.stack([logp.gather(-1, below.unsqueeze(-1)).squeeze(-1),
                          logp.gather(-1, (below + 1).unsqueeze(-1)).squeeze(-1)], -1)
    return -(torch.stack([1.0 - w_above, w_above], -1) * picked).sum(-1)


class TwoHotNLL(torch.autograd.Function):
    """Two-hot cross-entropies of n targets (n, ...) of the same logits (..., bins), with
    log p = logits - logsumexp gathered at the 2n target bins and the gradient written out:
    d/dlogits = softmax(logits) * sum_k g_k - sum_k g_k twohot_k, from the softmax the caller
    computed (a scale and a scatter of the 2n target weights). Autograd through log_softmax
    and gather would cost another exp pass, a zeroed (..., bins) gradient per target and a
    log-softmax backward: over the critic's imagined states x 255 bins those passes, not the
    arithmetic, are the cost."""

    generate_vmap_rule = True  # torch.func.vmap batches it op by op (several seeds)

    @staticmethod
    def forward(logits: torch.Tensor, probs: torch.Tensor, lse: torch.Tensor,
                below: torch.Tensor, w_above: torch.Tensor):
        idx = torch.stack([below, below + 1], -1)  # (n, ..., 2)
        weight = torch.stack([1.0 - w_above, w_above], -1)
        n = idx.shape[0]
        picked = logits.unsqueeze(0).expand(n, *logits.shape).gather(-1, idx) - lse
        return -(weight * picked).sum(-1)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, probs, _, below, w_above = inputs
        ctx.save_for_backward(probs, torch.stack([below, below + 1], -1),
                              torch.stack([1.0 - w_above, w_above], -1))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        probs, idx, weight = ctx.saved_tensors
        out = probs * grad.sum(0).unsqueeze(-1)
        for k in range(idx.shape[0]):
            out.scatter_add_(-1, idx[k], -(weight[k] * grad[k].unsqueeze(-1)))
        return out, None, None, None, None
