"""The Nature (2025) recipe's networks, sized as the authors' presets (`size1m` ... `size400m`
in danijar/dreamerv3's configs.yaml), laid out as their agent builds them: an encoder of
vector MLPs and the simple image encoder, the RSSM (block GRU, a 1-layer posterior and a
2-layer prior over 32 categorical latents), a decoder, reward and continue heads of 1 layer,
and actor and critic heads of 3 layers (with the critic's slow copy). The heads read
[h, z]; every hidden layer is Linear -> RMSNorm -> SiLU (lucid/nature_nets.py).

This file holds the networks and their one-step maths; the losses and the update that train
them follow in their own modules.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from .nature_nets import BlockGRU, ImageDecoder, ImageEncoder, Linear, mlp
from .config import NATURE_SIZES as SIZE_TABLE
from .nets import fp32, symlog
from .specs import ActionSpec, ObsSpec


@dataclass(frozen=True)
class NatureSize:
    deter: int
    hidden: int
    classes: int
    depth: int
    units: int
    stoch: int = 32
    blocks: int = 8
    bins: int = 255


NATURE_SIZES = {name: NatureSize(*dims) for name, dims in SIZE_TABLE.items()}


def _image_layout(obs: ObsSpec) -> tuple[tuple[int, int], int] | None:
    """(H, W) and the channels of all image keys, stacked on channels (one encoder)."""
    if not obs.images:
        return None
    sizes = {shape[:2] for shape in obs.images.values()}
    if len(sizes) > 1:
        raise ValueError(f"the Nature recipe stacks its images on channels: they need one "
                         f"size, got {sorted(sizes)}")
    return sizes.pop(), sum(shape[2] for shape in obs.images.values())


class NatureEncoder(nn.Module):
    """Tokens of one step: an MLP (3 layers) of the symlog'd vector keys, beside the image
    encoder's flattened map."""

    def __init__(self, obs: ObsSpec, size: NatureSize, layers: int = 3):
        super().__init__()
        self.vector_keys = sorted(obs.vectors)
        self.image_keys = sorted(obs.images)
        vec = sum(obs.vectors.values())
        self.mlp = mlp(vec, size.units, layers) if vec else None
        layout = _image_layout(obs)
        self.cnn = ImageEncoder(*layout, size.depth) if layout else None
        self.out_dim = (size.units if vec else 0) + (self.cnn.out_dim if self.cnn else 0)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = []
        if self.mlp is not None:
            parts.append(self.mlp(symlog(torch.cat([obs[k].float() for k in self.vector_keys],
                                                   -1))))
        if self.cnn is not None:
            parts.append(self.cnn(torch.cat([obs[k] for k in self.image_keys], -1)))
        return torch.cat(parts, -1)


class NatureDecoder(nn.Module):
    """Reconstructions from [z, h]: an MLP (3 layers) with a linear head per vector key
    (symlog MSE), and the image decoder (sigmoid pixels, MSE)."""

    def __init__(self, obs: ObsSpec, size: NatureSize, layers: int = 3):
        super().__init__()
        stoch_dim = size.stoch * size.classes
        self.vector_keys = sorted(obs.vectors)
        self.mlp = mlp(stoch_dim + size.deter, size.units, layers) if obs.vectors else None
        self.heads = nn.ModuleDict({k: Linear(size.units, obs.vectors[k])
                                    for k in self.vector_keys})
        layout = _image_layout(obs)
        self.cnn = ImageDecoder(size.deter, stoch_dim, *layout, size.depth, size.units,
                                bspace=size.blocks) if layout else None


class NatureRSSM(nn.Module):
    """h' = BlockGRU(h, z, a); posterior logits from [h', tokens] (1 layer), prior logits
    from h' (2 layers), over `stoch` categoricals of `classes`."""

    def __init__(self, tokens: int, act_dim: int, size: NatureSize):
        super().__init__()
        self.size = size
        stoch_dim = size.stoch * size.classes
        self.core = BlockGRU(size.deter, stoch_dim, act_dim, size.hidden, size.blocks)
        self.obs = mlp(size.deter + tokens, size.hidden, 1)
        self.obs_logit = Linear(size.hidden, stoch_dim)
        self.prior = mlp(size.deter, size.hidden, 2)
        self.prior_logit = Linear(size.hidden, stoch_dim)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        x = fp32(x)  # under bf16 autocast too: the categoricals and their KL in fp32
        return x.reshape(*x.shape[:-1], self.size.stoch, self.size.classes)

    def prior_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self._logits(self.prior_logit(self.prior(h)))

    def post_logits(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self._logits(self.obs_logit(self.obs(torch.cat([h, tokens], -1))))


class Head(nn.Module):
    """An MLP of [h, z] and a linear output layer (the authors' MLPHead)."""

    def __init__(self, feat: int, units: int, layers: int, out: int, outscale: float):
        super().__init__()
        self.mlp = mlp(feat, units, layers)
        self.out = Linear(units, out, outscale)

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        return fp32(self.out(self.mlp(feat)))  # distributions and losses run in fp32


class NatureActor(nn.Module):
    """The policy head: 3 layers, then a categorical's logits per discrete action (no unimix)
    and a bounded normal's mean and std for Box actions (separate output layers), output
    scale 0.01."""

    def __init__(self, feat: int, act: ActionSpec, size: NatureSize, layers: int = 3,
                 outscale: float = 0.01):
        super().__init__()
        self.mlp = mlp(feat, size.units, layers)
        self.logits = nn.ModuleList(Linear(size.units, n, outscale)
                                    for n in (act.discrete or ()))
        n_box = act.dim - act.n_discrete
        self.mean = Linear(size.units, n_box, outscale) if n_box else None
        self.std = Linear(size.units, n_box, outscale) if n_box else None


class NatureCritic(nn.Module):
    """The value head (3 layers, 255 symexp two-hot bins, output scale 0) and its slow copy."""

    def __init__(self, feat: int, size: NatureSize, layers: int = 3):
        super().__init__()
        self.net = Head(feat, size.units, layers, size.bins, 0.0)
        self.slow = copy.deepcopy(self.net).requires_grad_(False)


class NatureWorldModel(nn.Module):
    """Encoder, RSSM, decoder, reward (1 layer, 255 bins, output scale 0) and continue
    (1 layer) heads."""

    def __init__(self, obs: ObsSpec, act_dim: int, size: NatureSize):
        super().__init__()
        self.size = size
        self.encoder = NatureEncoder(obs, size)
        self.rssm = NatureRSSM(self.encoder.out_dim, act_dim, size)
        self.decoder = NatureDecoder(obs, size)
        self.feat_dim = size.deter + size.stoch * size.classes
        self.reward = Head(self.feat_dim, size.units, 1, size.bins, 0.0)
        self.cont = Head(self.feat_dim, size.units, 1, 1, 1.0)


def nature_modules(obs: ObsSpec, act: ActionSpec, size: str) -> dict[str, nn.Module]:
    """The recipe's world model, actor and critic for these spaces at `size` (1m ... 400m)."""
    if size not in NATURE_SIZES:
        raise ValueError(f"the Nature recipe's sizes are {', '.join(NATURE_SIZES)}, not "
                         f"{size!r}")
    s = NATURE_SIZES[size]
    wm = NatureWorldModel(obs, act.dim, s)
    return {"world_model": wm, "actor": NatureActor(wm.feat_dim, act, s),
            "critic": NatureCritic(wm.feat_dim, s)}
