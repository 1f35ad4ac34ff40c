"""Deterministic sampling for tests that compare two ways of computing the same update."""

import torch


def quantile_index(probs, u=None):
    """The categorical sampler (nets.categorical_index) with u = 0.5 instead of u ~ U(0, 1)
    per row: every row's sample then depends only on that row, so B rows on each of two ranks
    get exactly the samples the same 2B rows get in one process, and an update reads no random
    numbers (for discrete actions)."""
    return (torch.cumsum(probs.detach(), -1) < 0.5).sum(-1).clamp(max=probs.shape[-1] - 1)


def deterministic_sampling(patch=setattr):
    """Every sample of the update comes from `nets.categorical_index`: one-hot samples
    (nets.onehot_sample) and imagination's latents (nets.unimix_index, without
    train.cpp_kernels) draw through it."""
    import lucid.kernels
    import lucid.nets
    if lucid.kernels.enabled():
        raise RuntimeError("deterministic_sampling: train.cpp_kernels samples in C++; turn it off")
    patch(lucid.nets, "categorical_index", quantile_index)
