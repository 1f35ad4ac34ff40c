"""The Nature (2025) recipe's optimizer, as the authors' `Agent._make_opt` chains it
(danijar/dreamerv3, embodied/jax/opt.py), one optimizer over all modules:

    1. adaptive gradient clipping, per parameter tensor:
           g <- g / max(1, |g| / (agc · max(pmin, |θ|)))
    2. RMS scaling (no first moment here):
           ν <- β2 ν + (1 - β2) g²,   g <- g / (sqrt(ν / (1 - β2^t)) + ε)
    3. momentum of the scaled gradient (LaProp's order: normalize, then average):
           μ <- β1 μ + (1 - β1) g,    g <- μ / (1 - β1^t)
    4. θ <- θ - η_t g, with η_t = η · min(1, (t - 1) / warmup): a linear warm-up from 0 over
       the first `warmup` steps (optax counts from 0, so the first step moves nothing).

t counts the steps taken (1 at the first). Defaults: η 4e-5, agc 0.3, pmin 1e-3, β1 0.9,
β2 0.999, ε 1e-20, warm-up 1,000 steps.

As lucid's Adam steps do, a step whose `found_inf` (a tensor on the parameters' device) is
non-zero changes nothing: parameters, moments and the step count stay as they were, decided
on the device without reading a value back.
"""

from __future__ import annotations

import torch


class LaProp(torch.optim.Optimizer):
    """Adaptive gradient clipping, RMS scaling, then momentum, with a linear warm-up."""

    def __init__(self, params, lr: float = 4e-5, agc: float = 0.3, pmin: float = 1e-3,
                 beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-20,
                 warmup: int = 1000):
        if lr < 0 or agc < 0 or pmin < 0 or eps < 0 or warmup < 0:
            raise ValueError(f"LaProp needs lr, agc, pmin, eps and warmup >= 0, got lr={lr}, "
                             f"agc={agc}, pmin={pmin}, eps={eps}, warmup={warmup}")
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise ValueError(f"LaProp needs 0 <= beta1, beta2 < 1, got {beta1}, {beta2}")
        super().__init__(params, dict(lr=lr, agc=agc, pmin=pmin, beta1=beta1, beta2=beta2,
                                      eps=eps, warmup=warmup))
        self.found_inf: torch.Tensor | None = None  # set before step(): skip if non-zero

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._step_group(group, params)
        return loss

    def _step_group(self, group: dict, params: list[torch.Tensor]) -> None:
        b1, b2 = group["beta1"], group["beta2"]
        keep = None if self.found_inf is None else self.found_inf.to(params[0].device) != 0
        grads = [p.grad.float() if p.grad.dtype != p.dtype else p.grad for p in params]
        if group["agc"]:
            gnorm = torch._foreach_norm(grads)
            pnorm = torch._foreach_norm(params)
            for g, gn, pn in zip(grads, gnorm, pnorm):
                upper = group["agc"] * torch.clamp(pn, min=group["pmin"])
                g.mul_(1.0 / torch.clamp(gn / upper, min=1.0))
        for p, g in zip(params, grads):
            state = self.state[p]
            if not state:  # the step count in the parameter's dtype, as the moments
                state["step"] = torch.zeros((), dtype=p.dtype, device=p.device)
                state["nu"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["mu"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            t = state["step"] + 1
            lr = group["lr"] * (torch.clamp((t - 1) / group["warmup"], max=1.0)
                                if group["warmup"] else torch.ones_like(t))
            nu = b2 * state["nu"] + (1 - b2) * g * g
            scaled = g / (torch.sqrt(nu / (1 - b2 ** t)) + group["eps"])
            mu = b1 * state["mu"] + (1 - b1) * scaled
            new = p - lr * (mu / (1 - b1 ** t))
            if keep is not None:  # a skipped step: everything as it was
                nu, mu = torch.where(keep, state["nu"], nu), torch.where(keep, state["mu"], mu)
                new, t = torch.where(keep, p, new), torch.where(keep, state["step"], t)
            state["nu"].copy_(nu)
            state["mu"].copy_(mu)
            state["step"].copy_(t)
            p.copy_(new)
