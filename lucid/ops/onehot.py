"""One-hot features kept as class indices (`train.onehot_gather`): a Linear over
[dense, onehot(idx)] adds the weight columns of the active classes (a gather-sum) instead of
multiplying by inputs that are mostly zero. The plain twin is the dense features
(`OneHotCat.to_dense`) through the same layer; tests/test_fast_paths.py compares them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def one_hot(idx: torch.Tensor, classes: int, dtype: torch.dtype) -> torch.Tensor:
    """One-hot vectors of class indices (..., classes). A scatter, unlike F.one_hot, which
    checks the index range by reading values back to the host on CPUs."""
    out = torch.zeros(*idx.shape, classes, dtype=dtype, device=idx.device)
    return out.scatter(-1, idx.unsqueeze(-1), 1.0)  # out of place: vmap-safe (seeds)


class OneHotCat:
    """The features [dense[..., :at], onehot(idx), dense[..., at:]] with the one-hot codes kept
    as class indices idx (..., G) over `classes` K. A Linear over it (`linear_in`) adds the G
    weight columns of the active classes (one gather-sum) instead of multiplying G·K inputs
    that are mostly zero: the same function, a fraction of the arithmetic. Used for imagined
    states [h, z], whose one-hot z carries no gradient (`train.onehot_gather`)."""

    def __init__(self, dense: torch.Tensor, idx: torch.Tensor, classes: int, at: int):
        self.dense, self.idx, self.classes, self.at = dense, idx, classes, at

    def __getitem__(self, i) -> "OneHotCat":  # indexes the leading (batch, time) axes
        return OneHotCat(self.dense[i], self.idx[i], self.classes, self.at)

    def detach(self) -> "OneHotCat":
        return OneHotCat(self.dense.detach(), self.idx, self.classes, self.at)

    def to_dense(self) -> torch.Tensor:
        onehot = one_hot(self.idx, self.classes, self.dense.dtype).flatten(-2)
        return torch.cat([self.dense[..., :self.at], onehot, self.dense[..., self.at:]], -1)

    @staticmethod
    def stack(items: list["OneHotCat"]) -> "OneHotCat":
        first = items[0]
        return OneHotCat(torch.stack([x.dense for x in items]),
                         torch.stack([x.idx for x in items]), first.classes, first.at)


def linear_in(layer: nn.Linear, x: torch.Tensor | OneHotCat) -> torch.Tensor:
    """`layer(x)`, where x may be a `OneHotCat`."""
    if not isinstance(x, OneHotCat):
        return layer(x)
    w, at = layer.weight, x.at
    G, K = x.idx.shape[-1], x.classes
    end = at + G * K
    if at == 0:
        w_dense = w[:, end:]
    elif end == w.shape[1]:
        w_dense = w[:, :at]
    else:
        w_dense = torch.cat([w[:, :at], w[:, end:]], 1)
    out = F.linear(x.dense, w_dense, layer.bias)
    active = (x.idx + _offsets(G, K, x.idx.device)).reshape(-1, G)  # weight row per group
    table = w[:, at:end].t().contiguous()  # (G*K, units); a strided table gathers slowly
    if table.device.type == "cpu":
        gathered = gather_sum(active, table)
    else:
        gathered = F.embedding_bag(active, table, mode="sum")
    return out + gathered.reshape(out.shape).to(out.dtype)  # (rows, units) -> out's shape


@torch.library.custom_op("lucid::gather_sum", mutates_args=())
def gather_sum(idx: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Row r: sum over groups g of table[idx[r, g]] (embedding_bag's "sum"), whose table
    gradient is one index_add_ of the output gradient per group (`gather_sum_grad`): on
    CPUs several times faster than embedding_bag's own backward, which sorts all rows·G
    indices. Both are opaque operators, so `train.compile` calls them as they are instead
    of lowering the scatter into a slower generated loop."""
    return F.embedding_bag(idx, table, mode="sum")


@gather_sum.register_fake
def _(idx: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return table.new_empty(idx.shape[0], table.shape[1])


@torch.library.custom_op("lucid::gather_sum_grad", mutates_args=())
def gather_sum_grad(idx: torch.Tensor, grad: torch.Tensor, rows: int) -> torch.Tensor:
    """table_grad[idx[r, g]] += grad[r]: one index_add_ per group."""
    grad = grad.contiguous()
    table_grad = grad.new_zeros(rows, grad.shape[-1])
    for column in idx.unbind(-1):
        table_grad.index_add_(0, column, grad)
    return table_grad


@gather_sum_grad.register_fake
def _(idx: torch.Tensor, grad: torch.Tensor, rows: int) -> torch.Tensor:
    return grad.new_empty(rows, grad.shape[-1])


def _gather_sum_setup(ctx, inputs, output):
    idx, table = inputs
    ctx.save_for_backward(idx)
    ctx.rows = table.shape[0]


def _gather_sum_backward(ctx, grad):
    (idx,) = ctx.saved_tensors
    return None, gather_sum_grad(idx, grad, ctx.rows)


gather_sum.register_autograd(_gather_sum_backward, setup_context=_gather_sum_setup)


def _seed_first(x: torch.Tensor, dim: int | None, n: int) -> torch.Tensor:
    return x.movedim(dim, 0) if dim is not None else x.expand(n, *x.shape)


def _gather_sum_vmap(info, in_dims, idx, table):
    """Several seeds (torch.func.vmap): their tables as one of n·rows rows, each seed's
    indices offset to its own block, so one gather-sum serves all."""
    n = info.batch_size
    idx = _seed_first(idx, in_dims[0], n)
    if in_dims[1] is None:
        out = gather_sum(idx.reshape(-1, idx.shape[-1]), table)
    else:
        table = table.movedim(in_dims[1], 0)
        rows = table.shape[1]
        idx = idx + (torch.arange(n, device=idx.device) * rows).view(n, 1, 1)
        out = gather_sum(idx.reshape(-1, idx.shape[-1]), table.reshape(n * rows, -1))
    return out.view(n, -1, out.shape[-1]), 0


def _gather_sum_grad_vmap(info, in_dims, idx, grad, rows):
    n = info.batch_size
    idx, grad = _seed_first(idx, in_dims[0], n), _seed_first(grad, in_dims[1], n)
    idx = idx + (torch.arange(n, device=idx.device) * rows).view(n, 1, 1)
    out = gather_sum_grad(idx.reshape(-1, idx.shape[-1]), grad.reshape(-1, grad.shape[-1]),
                          n * rows)
    return out.view(n, rows, -1), 0


gather_sum.register_vmap(_gather_sum_vmap)
gather_sum_grad.register_vmap(_gather_sum_grad_vmap)


_OFFSETS: dict[tuple, torch.Tensor] = {}


def _offsets(groups: int, classes: int, device: torch.device) -> torch.Tensor:
    """First row of each group's block in the (G*K, units) weight table: 0, K, 2K, ..."""
    if torch.compiler.is_compiling():  # a constant of the graph; a lookup in the cache would
        return torch.arange(0, groups * classes, classes, device=device)  # guard on it
    key = (groups, classes, device)
    if key not in _OFFSETS:
        _OFFSETS[key] = torch.arange(0, groups * classes, classes, device=device)
    return _OFFSETS[key]
