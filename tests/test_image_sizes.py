"""Images of any size: the encoder halves the image until its shorter side is 4 to 8 pixels
(the authors' minres 4) and the decoder retraces those sizes, cutting the rows that "same"
padding added after odd sides. 64x64 keeps the four stages and the published counts."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from lucid.agent import Agent
from lucid.config import make_config
from lucid.specs import ActionSpec, ObsSpec
from lucid.nets import ChannelNorm, ImageDecoder, ImageEncoder, _Crop, image_sizes
from lucid.train import Trainer
from lucid.world_model import image_input


class SizedImageEnv(gym.Env):
    """A `height` x `width` x 3 uint8 image whose brightness counts the steps; 3 actions,
    reward 1 for action 1; 12-step episodes."""

    def __init__(self, height: int = 84, width: int = 84):
        self.shape = (height, width, 3)
        self.observation_space = gym.spaces.Box(0, 255, self.shape, np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self.t = 0

    def _obs(self):
        img = np.full(self.shape, 20 * self.t, np.uint8)
        img[: self.shape[0] // 2, :, 0] = 255  # some structure across the image
        return img

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(int(action) == 1), False, self.t >= 12, {}


# (H, W) -> stages and the encoder's last map, by hand: each stage takes n to ceil(n / 2),
# as many stages as leave the shorter side between 4 and 8
SIZES = {
    (64, 64): (4, (4, 4)),      # 64 32 16 8 4: the paper's size, unchanged
    (84, 84): (4, (6, 6)),      # 84 42 21 11 6
    (96, 96): (4, (6, 6)),      # 96 48 24 12 6
    (32, 32): (3, (4, 4)),      # 32 16 8 4
    (16, 16): (2, (4, 4)),      # 16 8 4
    (48, 80): (3, (6, 10)),     # 48 24 12 6 | 80 40 20 10
    (80, 48): (3, (10, 6)),
    (60, 64): (3, (8, 8)),      # 60 30 15 8 | 64 32 16 8: a side just under a power of two
}


@pytest.mark.parametrize("hw", list(SIZES))
def test_encoder_and_decoder_shapes_follow_the_image_size(hw):
    (h, w), (stages, last) = hw, SIZES[hw]
    mult, n = 4, 2
    sizes = image_sizes(h, w)
    assert len(sizes) == stages + 1 and sizes[0] == (h, w) and sizes[-1] == last
    torch.manual_seed(0)
    enc = ImageEncoder(3, mult, h, w)
    convs = [m for m in enc.net if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [mult * 2**i for i in range(stages)]
    assert all(c.kernel_size == (4, 4) and c.stride == (2, 2) for c in convs)
    img = torch.rand(n, 3, h, w) - 0.5
    fmap = enc.net(img)
    assert fmap.shape == (n, mult * 2 ** (stages - 1), *last)
    out = enc(img)
    assert out.shape == (n, enc.out_dim)
    assert enc.out_dim == mult * 2 ** (stages - 1) * math.prod(last)
    enc.channels_last = True  # the NHWC path gives the same values at every size
    torch.testing.assert_close(enc(img), out, atol=1e-5, rtol=1e-4)
    dec = ImageDecoder(40, 3, mult, h, w)
    assert dec.shape == (mult * 2 ** (stages - 1), *last)
    tconvs = [m for m in dec.net if isinstance(m, torch.nn.ConvTranspose2d)]
    channels = [mult * 2**i for i in range(stages - 2, -1, -1)]  # halving back to mult
    assert [c.out_channels for c in tconvs] == channels + [3]
    assert dec(torch.randn(5, 40)).shape == (5, 3, h, w)


def test_sides_below_8_pixels_are_refused():
    with pytest.raises(ValueError, match="at least 8 pixels"):
        ImageEncoder(3, 2, 7, 64)


def test_the_64x64_encoder_and_decoder_keep_their_parameter_counts():
    """By hand, mult m, 3 channels, 4 stages: the convolutions (4x4, no bias) and LayerNorms
    of the encoder; the decoder's Linear to the 8m x 4 x 4 map, its transposed convolutions
    and the last one's bias. And the XS world model for a 64x64x3 image and 6 actions is
    still the published 7,538,979."""
    m, feat = 24, 1280
    count = lambda mod: sum(p.numel() for p in mod.parameters())  # noqa: E731
    chans = [3, m, 2 * m, 4 * m, 8 * m]
    convs = sum(16 * a * b for a, b in zip(chans, chans[1:]))
    norms = 2 * (m + 2 * m + 4 * m + 8 * m)
    assert count(ImageEncoder(3, m, 64, 64)) == convs + norms
    assert ImageEncoder(3, m, 64, 64).out_dim == 8 * m * 16
    linear = feat * 8 * m * 16 + 8 * m * 16
    dec_norms = 2 * (4 * m + 2 * m + m)
    assert count(ImageDecoder(feat, 3, m, 64, 64)) == linear + convs + dec_norms + 3
    with torch.device("meta"):
        agent = Agent(ObsSpec.from_space(gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)),
                      ActionSpec.from_space(gym.spaces.Discrete(6)),
                      make_config("default", model={"size": "XS"}), device="meta")
    assert agent.num_params()["world_model"] == 7_538_979


def test_even_sides_take_the_plain_padding_1_convolutions():
    """No extra padding or cut anywhere at 64x64 (or any size that halves evenly): the
    layers, and their names in a checkpoint, are the four (conv, norm, SiLU) stages as ever."""
    enc, dec = ImageEncoder(3, 2, 64, 64), ImageDecoder(8, 3, 2, 64, 64)
    assert [type(m) for m in enc.net] == [torch.nn.Conv2d, ChannelNorm, torch.nn.SiLU] * 4
    assert [type(m) for m in dec.net] == ([torch.nn.ConvTranspose2d, ChannelNorm, torch.nn.SiLU]
                                          * 3 + [torch.nn.ConvTranspose2d])
    odd = ImageEncoder(3, 2, 84, 84), ImageDecoder(8, 3, 2, 84, 84)  # 21 and 11 are odd
    assert sum(isinstance(m, torch.nn.ZeroPad2d) for m in odd[0].net) == 2
    assert [m.size for m in odd[1].net if isinstance(m, _Crop)] == [(11, 11), (21, 21)]


@pytest.mark.parametrize("size", [(11, 13), (9, 8), (15, 15), (12, 10)])
def test_the_decoder_stage_is_the_transpose_of_the_encoder_stage(size):
    """One stage (a side of 8 to 15 pixels): with the same weights, the decoder's transposed
    convolution, cut to the encoder's input size, is the adjoint of the encoder's padded
    convolution, <conv(x), y> = <conv_t(y), x>. So the zero row or column that "same"
    padding adds after an odd side is the one the decoder drops."""
    torch.manual_seed(1)
    enc = ImageEncoder(3, 5, *size).double()
    dec = ImageDecoder(4, 3, 5, *size).double()
    assert len(enc.sizes) == 2
    conv = enc.net[:-2]  # the padding (if any) and the convolution, without norm and SiLU
    tconv = dec.net
    with torch.no_grad():
        tconv[0].weight.copy_(conv[-1].weight)  # (5, 3, 4, 4) in both layouts
        tconv[0].bias.zero_()
    x = torch.randn(2, 3, *size, dtype=torch.float64)
    y = torch.randn_like(conv(x))
    assert y.shape[-2:] == enc.sizes[1] == tuple(-(-s // 2) for s in size)
    back = tconv(y)
    assert back.shape == x.shape
    torch.testing.assert_close((conv(x) * y).sum(), (back * x).sum())


@pytest.mark.parametrize("hw", [(84, 84), (48, 80)])
def test_world_model_reconstructs_images_of_their_own_size(hw):
    space = gym.spaces.Box(0, 255, (*hw, 3), np.uint8)
    spec = ObsSpec.from_space(space)
    torch.manual_seed(0)
    agent = Agent(spec, ActionSpec.from_space(gym.spaces.Discrete(3)),
                  make_config("default", model={"size": "nano"}))
    B, T = 2, 3
    obs = {"image": torch.from_numpy(np.stack([space.sample() for _ in range(B * T)]))
           .reshape(B, T, *hw, 3)}
    embed = agent.wm.encoder(obs)
    assert embed.shape == (B, T, agent.wm.encoder.out_dim)
    recon = agent.wm.decoder(torch.randn(B, T, agent.wm.feat_dim))
    assert recon["image"].shape == image_input(obs["image"]).shape == (B, T, 3, *hw)
    loss = agent.wm.decoder.loss(recon, obs)
    assert loss.shape == (B, T) and torch.isfinite(loss).all()


@pytest.mark.parametrize("hw", [(84, 84), (32, 32)])
def test_an_agent_trains_on_an_image_env_of_that_size(hw, tmp_path):
    cfg = make_config("default",
                      env={"id": "test_image_sizes:SizedImageEnv",
                           "kwargs": {"height": hw[0], "width": hw[1]}},
                      model={"size": "nano"},
                      train={"batch_size": 2, "batch_length": 8, "horizon": 3, "prefill": 16,
                             "train_ratio": 8, "replay_capacity": 1000},
                      run={"steps": 32, "log_every": 0.0, "progress": False,
                           "run_dir": str(tmp_path)})
    tr = Trainer(cfg)
    assert tr.agent.obs_spec.images == {"image": (*hw, 3)}
    seen = []
    real = tr.agent.train_step

    def recorded(batch):
        seen.append(tuple(batch["obs"]["image"].shape))
        out = real(batch)
        assert all(torch.isfinite(v).all() for v in out.values())
        return out

    tr.agent.train_step = recorded
    with tr:
        tr.run()
    assert tr.counters["updates"] == len(seen) == (32 - 16) * 8 // 16
    assert set(seen) == {(2, 8, *hw, 3)}


def test_images_of_any_size_from_16_pixels_a_side_are_accepted():
    for hw in ((84, 84), (60, 64), (17, 23), (210, 160)):
        spec = ObsSpec.from_space(gym.spaces.Box(0, 255, (*hw, 3), np.uint8))
        assert spec.images == {"image": (*hw, 3)}
