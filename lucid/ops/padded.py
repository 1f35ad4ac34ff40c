"""The padded output layer of the 255-bin heads (`train.pad_bins`): logits come back with
extra -inf columns (probability exactly 0, the same distribution), because CPU matrix
products and softmaxes run faster over a width that is a multiple of 8 than over 255, and a
softmax over a 255-column slice of a wider product would first copy the slice. The plain
twin is the layer itself (`F.linear`); tests/test_fast_paths.py compares them."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def padded_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, extra: int
                  ) -> torch.Tensor:
    """F.linear(x, w, b) followed by `extra` columns of -inf; with gradient, the plain
    layer's gradients (`PaddedLinear`)."""
    if torch.is_grad_enabled():
        return PaddedLinear.apply(x, w, b, extra)
    return _padded(x, w, b, extra)


def _padded(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, extra: int) -> torch.Tensor:
    """F.linear(x, w, b) followed by `extra` columns of -inf logits: w padded by zero rows,
    b by -inf."""
    return F.linear(x, F.pad(w, (0, 0, 0, extra)), F.pad(b, (0, extra), value=float("-inf")))


class PaddedLinear(torch.autograd.Function):
    """`_padded` with the plain layer's gradients: the padded columns' gradient is
    dropped, and the products run in the dtype the forward ran in (bf16 under autocast, as
    autocast's own linear)."""

    generate_vmap_rule = True  # torch.func.vmap batches it op by op (several seeds)

    @staticmethod
    def forward(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, extra: int):
        return _padded(x, w, b, extra)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, b, _ = inputs
        ctx.save_for_backward(x, w)
        ctx.bias_dtype = b.dtype

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, w = ctx.saved_tensors  # as passed in (fp32 under autocast): their own dtypes
        n = w.shape[0]
        rows = grad.reshape(-1, grad.shape[-1])  # (rows, n + extra), contiguous
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = (grad[..., :n] @ w.to(grad.dtype)).to(x.dtype)
        if ctx.needs_input_grad[1]:  # column sums and products over all rows, then the first n
            grad_w = (rows.t() @ x.reshape(-1, x.shape[-1]).to(grad.dtype))[:n].to(w.dtype)
        if ctx.needs_input_grad[2]:
            grad_b = rows.sum(0)[:n].to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None
