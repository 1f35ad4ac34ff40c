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
    (nets.onehot_sample) and imagination's latents (nets.unimix_index) draw through it. Box actions (the actor's Normal) take fixed noise
    (0.5), also where the actor draws its own (imagination with gradients through the
    dynamics)."""
    import lucid.behavior
    import lucid.nets
    patch(lucid.nets, "categorical_index", quantile_index)
    actor = lucid.behavior.Actor
    draw, sample = actor.noise, actor.sample

    def fixed_noise(self, *shape: int, device=None):  # Actor.noise's layout, every value 0.5
        return torch.full_like(draw(self, *shape, device=device), 0.5)

    def fixed_sample(self, params, noise=None):
        cats, normal = self._split(params)
        if noise is None and normal is not None:
            noise = fixed_noise(self, *normal[0].shape[:-1], device=normal[0].device)
        return sample(self, params, noise)
    patch(actor, "noise", fixed_noise)
    patch(actor, "sample", fixed_sample)
