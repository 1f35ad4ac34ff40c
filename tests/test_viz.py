"""Videos, open-loop dreams, learning-curve plots, HTML reports and their CLI commands, on
two tiny real CartPole runs (nano model, 160 env steps each) and a small image env."""

import base64
import io
import json
import shutil
from pathlib import Path
from html.parser import HTMLParser

import gymnasium as gym
import imageio.v2 as iio
import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from procs import run_grouped

from lucid import video
from lucid.agent import Agent
from lucid.cli import app
from lucid.config import as_dict, make_config
from lucid.specs import ActionSpec, ObsSpec
from lucid.nets import onehot_mode, symexp
from lucid.plot import eval_points, group_curve, group_runs, load_run, plot_runs
from lucid.replay import to_batch
from lucid.report import write_report
from lucid.acting import load_to_act
from lucid.train import Trainer

cli = CliRunner()
STEPS = 160


def _tiny_run(path, seed):
    cfg = make_config("cpu-control", [
        "model.size=nano", "train.prefill=64", f"run.steps={STEPS}", "train.batch_size=2",
        "train.batch_length=8", "train.train_ratio=8", "train.horizon=5", "run.progress=false",
        "run.log_every=0", f"run.seed={seed}", f"run.run_dir={path}"])
    tr = Trainer(cfg)
    try:
        tr.run()  # ends with a checkpoint and the replay on disk
    finally:
        tr.close()
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    return [_tiny_run(base / f"s{s}", s) for s in (0, 1)]


@pytest.fixture(scope="module")
def trainer(runs):
    return load_to_act(runs[0])


class DotEnv(gym.Env):
    """16x16 RGB image with a bright 2x2 dot that the action moves left or right."""

    def __init__(self, render_mode=None):
        self.observation_space = gym.spaces.Box(0, 255, (16, 16, 3), np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.x, self.t = 0, 0

    def _obs(self):
        img = np.full((16, 16, 3), 20, np.uint8)
        img[7:9, self.x:self.x + 2] = (250, 120, 30)
        return img

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = 7, 0
        return self._obs(), {}

    def step(self, action):
        self.x = int(np.clip(self.x + (1 if action else -1), 0, 14))
        self.t += 1
        return self._obs(), 1.0, False, self.t >= 6, {}


def _image_agent():
    env = DotEnv()
    spec, act = ObsSpec.from_space(env.observation_space), ActionSpec.from_space(env.action_space)
    torch.manual_seed(0)
    return Agent(spec, act, make_config("default", model={"size": "nano"}))


def _image_batch(B=2, T=8):
    env, rng = DotEnv(), np.random.default_rng(0)
    obs, acts, first = [], [], []
    for _ in range(B):
        o, _ = env.reset()
        row_o, row_a = [], []
        for _ in range(T):
            a = int(rng.integers(2))
            row_o.append(o)
            row_a.append(np.eye(2, dtype=np.float32)[a])
            o, *_ = env.step(a)
        obs.append(row_o)
        acts.append(row_a)
        first.append([True] + [False] * (T - 1))
    return to_batch({"obs/image": np.array(obs, np.uint8), "action": np.array(acts),
                     "is_first": np.array(first), "reward": np.zeros((B, T), np.float32),
                     "is_last": np.zeros((B, T), bool), "is_terminal": np.zeros((B, T), bool)},
                    torch.device("cpu"))


# --------------------------------------------------------------------------- files


def test_video_files_round_trip(tmp_path):
    frames = np.zeros((7, 33, 50, 3), np.uint8)  # odd height: MP4 pads one row
    for t in range(7):
        frames[t, :, : 5 * (t + 1)] = (255, 0, 0) if t % 2 else (0, 0, 255)
    mp4 = video.read_video(video.write_video(tmp_path / "a.mp4", frames, fps=10))
    assert mp4.shape == (7, 34, 50, 3)
    assert np.abs(mp4[:, :33].astype(int) - frames).mean() < 8  # lossy, but the same picture
    gif = video.read_video(video.write_video(tmp_path / "a.gif", frames, fps=10))
    assert gif.shape == (7, 33, 50, 3)
    np.testing.assert_array_equal(gif, frames)  # three exact colors survive the palette
    with pytest.raises(ValueError, match="mp4 or .gif"):
        video.write_video(tmp_path / "a.avi", frames)


def _media(logdir: Path) -> Path:
    """Where TensorBoard videos are: add_video's own file, or without moviepy the GIF
    records' run `videos` beside it."""
    return logdir if video.has_moviepy() else logdir / "videos"


def test_tensorboard_video_is_readable(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter
    frames = np.random.default_rng(0).integers(0, 255, (5, 16, 24, 3), dtype=np.uint8)
    writer = SummaryWriter(str(tmp_path))
    how = video.log_video(writer, "dream/open_loop", frames, step=7)
    writer.close()
    acc = EventAccumulator(str(_media(tmp_path)), size_guidance={"images": 0})
    acc.Reload()
    (event,) = acc.Images("dream/open_loop")
    assert event.step == 7 and (event.width, event.height) == (24, 16)
    if how == "gif":  # no moviepy: an animated GIF in an image summary, like add_video's
        decoded = iio.mimread(event.encoded_image_string, format="GIF")
        assert len(decoded) == 5
    else:
        assert how == "video"
    # a long video keeps frames spread over all of it, the first and the last among them
    long = np.zeros((50, 16, 24, 3), np.uint8)
    long[:, :, :, 0] = (np.arange(50) * 5)[:, None, None]
    writer = SummaryWriter(str(tmp_path / "long"))
    how = video.log_video(writer, "eval/video", long, step=1, max_frames=6)
    writer.close()
    if how == "gif":
        acc = EventAccumulator(str(_media(tmp_path / "long")), size_guidance={"images": 0})
        acc.Reload()
        (event,) = acc.Images("eval/video")
        reds = [int(f[0, 0, 0]) for f in iio.mimread(event.encoded_image_string, format="GIF")]
        assert reds == [0, 50, 100, 145, 195, 245], reds  # frames 0, 10, 20, 29, 39, 49


def test_video_frame_rates_are_kept_and_large_tensorboard_frames_are_subsampled(tmp_path):
    """fps reaches the MP4 and the GIF (1000/fps ms a frame), also TensorBoard's GIF; frames
    wider than max_side keep every ceil(W / max_side)-th pixel; MP4 pads odd sides with
    black below and to the right."""
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter
    frames = np.full((4, 15, 32, 3), 255, np.uint8)
    frames[:, 5:] = (50 * np.arange(4, dtype=np.uint8))[:, None, None, None]  # all different
    mp4 = video.write_video(tmp_path / "a.mp4", frames, fps=12)
    reader = iio.get_reader(mp4)
    assert reader.get_meta_data()["fps"] == 12
    reader.close()
    padded = video.read_video(mp4)
    assert padded.shape == (4, 16, 32, 3) and padded[:, 0].min() > 200
    assert Image.open(video.write_video(tmp_path / "a.gif", frames, fps=10)).info["duration"] \
        == 100
    writer = SummaryWriter(str(tmp_path / "tb"))
    wide = np.broadcast_to((40 * np.arange(3, dtype=np.uint8))[:, None, None, None],
                           (3, 6, 600, 3))  # three different frames
    how = video.log_video(writer, "v", wide, 1, fps=5, max_side=480)
    writer.close()
    acc = EventAccumulator(str(_media(tmp_path / "tb")), size_guidance={"images": 0})
    acc.Reload()
    (event,) = acc.Images("v")
    assert (event.width, event.height) == (300, 3)  # every 2nd pixel of 600 x 6
    if how == "gif":
        assert Image.open(io.BytesIO(event.encoded_image_string)).info["duration"] == 200


def test_frames_of_any_channel_count_become_rgb_and_tile_row_major():
    """to_rgb: grey (2-D or one channel) repeats into R, G and B, two channels get the first
    again as blue, a fourth (alpha) channel is dropped, and other dtypes are clipped into
    0..255 (not wrapped). tile: row-major in ceil(sqrt(n)) columns, black where empty."""
    grey = np.arange(6, dtype=np.uint8).reshape(2, 3)
    for g in (grey, grey[..., None]):
        np.testing.assert_array_equal(video.to_rgb(g), np.stack([grey] * 3, -1))
    two = np.stack([grey, grey + 10], -1)
    np.testing.assert_array_equal(video.to_rgb(two), np.stack([grey, grey + 10, grey], -1))
    rgba = np.stack([grey, grey + 10, grey + 20, np.full_like(grey, 255)], -1)
    np.testing.assert_array_equal(video.to_rgb(rgba), rgba[..., :3])
    np.testing.assert_array_equal(video.to_rgb(np.array([[-5.0, 300.0, 7.9]])),
                                  [[[0] * 3, [255] * 3, [7] * 3]])
    with pytest.raises(ValueError, match="no frames"):
        video.stack_frames([])
    frames = np.broadcast_to(np.arange(1, 6, dtype=np.uint8)[:, None, None, None], (5, 2, 2, 3))
    img = video.tile(frames)  # 5 frames: 3 columns, 2 rows, the last cell black
    assert img.shape == (4, 6, 3)
    np.testing.assert_array_equal(img[::2, ::2, 0], [[1, 2, 3], [4, 5, 0]])
    np.testing.assert_array_equal(video.tile(frames, cols=2)[::2, ::2, 0],
                                  [[1, 2], [3, 4], [5, 0]])


def test_dream_windows_are_the_clean_ones_of_a_wrapped_replay():
    """dream_batch reads the ring buffer from its oldest step on, and takes every window (the
    last one included) in which no episode starts after the first step, and only those."""
    from lucid.replay import Replay
    fields = {"obs/vector": ((1,), np.float32), "action": ((1,), np.float32),
              "reward": ((), np.float32), "is_first": ((), bool), "is_last": ((), bool),
              "is_terminal": ((), bool)}
    rep = Replay(20, 1, fields)  # 20 slots: after 33 steps it holds steps 13..32
    for t in range(33):
        rep.add({"obs/vector": np.full((1, 1), t, np.float32), "action": np.zeros((1, 1)),
                 "reward": np.full(1, t, np.float32), "is_first": np.full(1, t % 9 == 0),
                 "is_last": np.zeros(1, bool), "is_terminal": np.zeros(1, bool)})
    batch = video.dream_batch(rep, 300, 6, seed=0)
    steps = batch["reward"].numpy()
    np.testing.assert_array_equal(steps, steps[:, :1] + np.arange(6))  # consecutive steps
    # episodes start at 18 and 27: windows of 6 steps free of a later start begin at these
    assert set(steps[:, 0].astype(int)) == {18, 19, 20, 21, 27}


# --------------------------------------------------------------------------- episodes


def test_recorded_episodes_render_the_env(trainer):
    torch.manual_seed(5)  # the posterior latents are sampled even by the greedy policy
    recs = video.record_episodes(trainer.agent, "CartPole-v1", 2, seed=3)
    for r in recs:
        assert r.frames.shape == (r.length + 1, 400, 600, 3)
        assert r.ret == r.length  # CartPole: reward 1 per step
    # same env seed and torch seed: the same episode again
    torch.manual_seed(5)
    again = video.record_episodes(trainer.agent, "CartPole-v1", 1, seed=3)[0]
    np.testing.assert_array_equal(again.frames, recs[0].frames)


def test_recorded_episodes_are_the_episodes_evaluate_runs(trainer):
    """`lucid eval --seed S --video` shows (and prints) the episodes `lucid eval --seed S`
    prints: the same env seeding and the same policy calls, episode after episode."""
    torch.manual_seed(5)
    want = [(e.ret, e.length) for e in trainer.evaluate(4, seed=3)]
    torch.manual_seed(5)
    got = [(r.ret, r.length) for r in video.record_episodes(trainer.agent, "CartPole-v1", 4,
                                                               seed=3)]
    assert got == want and len(set(want)) > 1  # distinct episodes, not one repeated
    # an episode cut at max_steps is partial, and the next one starts afresh
    torch.manual_seed(5)
    cut = video.record_episodes(trainer.agent, "CartPole-v1", 2, seed=3, max_steps=5)
    assert [(r.ret, r.length, len(r.frames)) for r in cut] == [(5.0, 5, 6)] * 2


def test_a_downsampled_recording_keeps_every_kth_pixel_of_the_rendered_frames(trainer):
    torch.manual_seed(5)
    full = video.record_episodes(trainer.agent, "CartPole-v1", 1, seed=3, max_steps=3)[0]
    torch.manual_seed(5)
    half = video.record_episodes(trainer.agent, "CartPole-v1", 1, seed=3, max_steps=3,
                                 downsample=2)[0]
    np.testing.assert_array_equal(half.frames, full.frames[:, ::2, ::2])


def test_recorded_episodes_of_image_env_are_the_observations():
    agent = _image_agent()
    (rec,) = video.record_episodes(agent, f"{__name__}:DotEnv", 1, seed=0)
    assert rec.length == 6 and rec.frames.shape == (7, 16, 16, 3)
    np.testing.assert_array_equal(rec.frames[0], DotEnv().reset()[0])


# --------------------------------------------------------------------------- open loop


def _dreams_open_loop(agent, batch, res) -> None:
    """Open loop (context 3, horizon 5, torch seed 1 as `res` was made): observations after
    the context never reach the model, the actions from the context's last step on drive
    the dream."""
    changed = {**batch, "obs": {"image": batch["obs"]["image"].clone()}}
    changed["obs"]["image"][:, 3:] = 0
    torch.manual_seed(1)
    again = video.open_loop(agent, changed, context=3, horizon=5)
    np.testing.assert_array_equal(again.pred["image"], res.pred["image"])
    flipped = {**batch, "action": batch["action"].clone()}
    flipped["action"][:, 2:] = flipped["action"][:, 2:].flip(-1)
    torch.manual_seed(1)
    other = video.open_loop(agent, flipped, context=3, horizon=5)
    np.testing.assert_array_equal(other.pred["image"][:, :3], res.pred["image"][:, :3])
    assert not np.array_equal(other.pred["image"][:, 3:], res.pred["image"][:, 3:])


def test_open_loop_image_panels_and_dream_ignores_later_observations():
    agent, batch = _image_agent(), _image_batch()
    torch.manual_seed(1)
    res = video.open_loop(agent, batch, context=3, horizon=5)
    truth = batch["obs"]["image"].numpy()
    assert res.truth["image"].shape == res.pred["image"].shape == (2, 8, 16, 16, 3)
    frames = res.frames(labels=False, scale=1)
    H, W, bar = 16, 16, video.BAR
    assert frames.shape == (8, 2 * (H + bar), 3 * W, 3)
    for b in range(2):
        y = b * (H + bar)
        np.testing.assert_array_equal(frames[:, y:y + H, :W], truth[b])  # truth panel
        np.testing.assert_array_equal(frames[:, y:y + H, W:2 * W], res.pred["image"][b])
        err = np.abs(truth[b].astype(int) - res.pred["image"][b].astype(int))
        np.testing.assert_array_equal(frames[:, y:y + H, 2 * W:], err)
        assert (frames[:3, y + H] == video.CONTEXT_COLOR).all()  # context bar
        assert (frames[3:, y + H] == video.DREAM_COLOR).all()  # dream bar
    # Context reconstructions decode the posterior of the first 3 observations (its latents
    # are samples: the same torch seed gives the same ones).
    wm = agent.wm
    torch.manual_seed(1)
    with torch.no_grad():
        h, z, *_ = wm.observe(wm.encoder({"image": batch["obs"]["image"][:, :3]}),
                              batch["action"][:, :3], batch["is_first"][:, :3])
        recon = wm.decoder(wm.feat(h, z))["image"]
    recon = ((recon + 0.5) * 255).clamp(0, 255).round().to(torch.uint8).movedim(-3, -1)
    np.testing.assert_array_equal(res.pred["image"][:, :3], recon.numpy())
    _dreams_open_loop(agent, batch, res)
    with pytest.raises(ValueError, match="exceeds"):
        video.open_loop(agent, batch, context=3, horizon=6)


def test_nature_dreams_decode_the_posterior_then_run_the_prior():
    """The Nature recipe's dream: the context decodes the posterior states (zero start, the
    image decoder's sigmoid pixels to uint8), then the prior runs on the recorded actions
    alone."""
    from lucid.nature_agent import NatureAgent, NatureState
    env = DotEnv()
    spec, act = ObsSpec.from_space(env.observation_space), ActionSpec.from_space(env.action_space)
    torch.manual_seed(0)
    agent = NatureAgent(spec, act, make_config("nature", model={"size": "1m"}))
    batch = _image_batch()
    torch.manual_seed(1)
    res = video.open_loop(agent, batch, context=3, horizon=5)
    assert res.pred["image"].shape == (2, 8, 16, 16, 3) and res.pred["image"].dtype == np.uint8
    torch.manual_seed(1)  # the same posterior samples, step by step through the networks
    with torch.no_grad():
        tokens = agent.wm.encoder({"image": batch["obs"]["image"][:, :3]})
        state, recon = agent.initial(2), []
        for t in range(3):
            state, _ = agent.obs_step(state, tokens[:, t], batch["is_first"][:, t])
            recon.append(agent.wm.decoder.cnn(state.h, state.z.flatten(-2)))
            state = NatureState(state.h, state.z, batch["action"][:, t])
    recon = (torch.stack(recon, 1).clamp(0, 1) * 255).round().to(torch.uint8)
    np.testing.assert_array_equal(res.pred["image"][:, :3], recon.numpy())
    _dreams_open_loop(agent, batch, res)


def test_nature_dreams_split_images_and_vectors_by_key():
    from lucid.nature_agent import NatureAgent
    spec = ObsSpec(images={"a": (16, 16, 3), "b": (16, 16, 1)}, vectors={"v": 2})
    act = ActionSpec.from_space(gym.spaces.Discrete(2))
    agent = NatureAgent(spec, act, make_config("nature", model={"size": "1m"}))
    B, T = 2, 4
    obs = {"a": torch.zeros(B, T, 16, 16, 3, dtype=torch.uint8),
           "b": torch.zeros(B, T, 16, 16, 1, dtype=torch.uint8), "v": torch.randn(B, T, 2)}
    first = torch.zeros(B, T, dtype=torch.bool)
    first[:, 0] = True
    actions = torch.eye(2)[torch.zeros(B, T, dtype=torch.long)]
    torch.manual_seed(2)
    pred = agent.dream(obs, actions, first, 2, 2)
    assert pred["a"].shape == (B, T, 16, 16, 3) and pred["b"].shape == (B, T, 16, 16, 1)
    assert pred["v"].shape == (B, T, 2) and pred["v"].dtype == torch.float32
    assert pred["a"].dtype == pred["b"].dtype == torch.uint8
    # step 0 through the networks: the decoder's stacked channels are a's, then b's (sorted
    # keys), the vector head's output is in symlog space
    torch.manual_seed(2)
    with torch.no_grad():
        tokens = agent.wm.encoder({k: v[:, :1] for k, v in obs.items()})
        state, _ = agent.obs_step(agent.initial(B), tokens[:, 0], first[:, 0])
        pixels = agent.wm.decoder.cnn(state.h, state.z.flatten(-2))
        x = agent.wm.decoder.mlp(torch.cat([state.z.flatten(-2), state.h], -1))
        vec = agent.wm.decoder.heads["v"](x)
    pixels = (pixels.clamp(0, 1) * 255).round().to(torch.uint8)
    assert torch.equal(pred["a"][:, 0], pixels[..., :3])
    assert torch.equal(pred["b"][:, 0], pixels[..., 3:])
    torch.testing.assert_close(pred["v"][:, 0], torch.sign(vec) * torch.expm1(vec.abs()))


def test_each_dreamed_step_follows_the_action_recorded_one_step_before_it():
    """h[t] = f(h[t-1], z[t-1], a[t-1]): with context 3 and horizon 5 the dream uses the
    actions of steps 2..6; the last recorded action (step 7) leads nowhere in the window."""
    agent, batch = _image_agent(), _image_batch()

    def dream(action):
        torch.manual_seed(1)
        return video.open_loop(agent, {**batch, "action": action}, context=3,
                               horizon=5).pred["image"]

    base = dream(batch["action"])
    # the first dreamed step, from the posterior state of the last context step
    wm = agent.wm
    torch.manual_seed(1)
    with torch.no_grad():
        h, z, *_ = wm.observe(wm.encoder({"image": batch["obs"]["image"][:, :3]}),
                              batch["action"][:, :3], batch["is_first"][:, :3])
        h3 = wm.sequence(h[:, 2], z[:, 2], batch["action"][:, 2])
        z3 = onehot_mode(wm.prior_logp(h3))
        first = wm.decoder(wm.feat(h3, z3)[:, None])["image"][:, 0]
    first = ((first + 0.5) * 255).clamp(0, 255).round().to(torch.uint8).movedim(-3, -1)
    np.testing.assert_array_equal(base[:, 3], first.numpy())
    for t, matters in ((2, True), (7, False)):
        action = batch["action"].clone()
        action[:, t] = action[:, t].flip(-1)
        other = dream(action)
        np.testing.assert_array_equal(other[:, :3], base[:, :3])  # the context: filtered
        assert (not np.array_equal(other[:, 3], base[:, 3])) == matters, t


def test_open_loop_defaults_limits_errors_and_the_rows_it_draws():
    """The horizon defaults to the rest of the batch; context 0 is refused; `error` is
    |truth - prediction| without uint8 wrap-around; frames(rows=1) draws the first row."""
    agent, batch = _image_agent(), _image_batch()
    torch.manual_seed(1)
    res = video.open_loop(agent, batch, context=3)
    assert (res.horizon, res.length, res.pred["image"].shape[1]) == (5, 8, 8)
    with pytest.raises(ValueError, match="context must be in"):
        video.open_loop(agent, batch, context=0)
    want = np.abs(res.truth["image"].astype(int) - res.pred["image"].astype(int))
    np.testing.assert_array_equal(res.error("image"), want)
    vec = video.OpenLoop(1, 1, {"v": np.array([[[1.0], [2.0]]])},
                         {"v": np.array([[[3.0], [1.5]]])}, vectors=["v"])
    np.testing.assert_allclose(vec.error("v"), [[[2.0], [0.5]]])
    one = res.frames(rows=1, labels=False, scale=1)
    assert one.shape == (8, 16 + video.BAR, 3 * 16, 3)
    np.testing.assert_array_equal(one, res.frames(labels=False, scale=1)[:, :16 + video.BAR])
    # as videos show them: 16-pixel panels scaled 12x (to PANEL_MIN = 192; every pixel kept),
    # under a strip naming the columns and the phase
    shown, L, s = res.frames(), video.LABEL_H, 12
    assert shown.shape == (8, L + 2 * (16 * s + video.BAR), 3 * 16 * s, 3)
    plain = res.frames(labels=False, scale=1)
    np.testing.assert_array_equal(shown[:, L:L + 16 * s:s, ::s], plain[:, :16])
    np.testing.assert_array_equal(shown[:, L + 16 * s, ::s], plain[:, 16])  # the bar: not taller
    strip = shown[:, :L]
    assert strip.std() > 10  # text on the strip
    np.testing.assert_array_equal(strip[0], strip[2])  # the same strip while it observes
    assert (strip[2] != strip[3]).any()  # observing -> dreaming: the strip says so
    np.testing.assert_array_equal(strip[3], strip[7])


def test_a_video_writer_closed_by_an_error_keeps_its_frames_and_the_error(tmp_path):
    """An exception inside `with VideoWriter(...)` still finishes the file with the frames
    written so far; with none written, the exception itself comes through."""
    frames = np.zeros((2, 8, 8, 3), np.uint8)
    frames[1] = 255  # two different frames (a GIF merges equal neighbours)
    with pytest.raises(KeyError):
        with video.VideoWriter(tmp_path / "b.gif") as w:
            w.append(frames[0])
            w.append(frames[1])
            raise KeyError("stop")
    assert len(video.read_video(tmp_path / "b.gif")) == 2
    with pytest.raises(KeyError):
        with video.VideoWriter(tmp_path / "c.gif"):
            raise KeyError("nothing written")


def test_pendulum_and_acrobot_states_are_drawn_from_their_observations():
    """StateRenderer turns the observations (cos, sin of each angle, velocities) back into
    the env's angles: the picture is the one the env draws of that state."""
    for env_id, state, obs in (
            ("Pendulum-v1", [0.4, 0.0], [np.cos(0.4), np.sin(0.4), 0.0]),
            ("Acrobot-v1", [0.4, -1.1, 0.0, 0.0],
             [np.cos(0.4), np.sin(0.4), np.cos(-1.1), np.sin(-1.1), 0.0, 0.0])):
        env = gym.make(env_id, render_mode="rgb_array")
        renderer = video.StateRenderer(env_id)
        try:
            env.reset(seed=0)
            env.unwrapped.state = np.array(state)
            np.testing.assert_array_equal(renderer.render(np.array(obs)), env.render())
        finally:
            env.close()
            renderer.close()


def test_open_loop_cartpole_renders_dreamed_states_beside_real_ones(trainer, tmp_path):
    batch = video.dream_batch(trainer.replay, 2, 12, seed=0)
    assert not batch["is_first"][:, 1:].any()  # one continuous episode per window
    torch.manual_seed(2)
    res = video.open_loop(trainer.agent, batch, context=4, horizon=8)
    truth = batch["obs"]["vector"].numpy()
    np.testing.assert_array_equal(res.truth["vector"], truth)
    wm = trainer.agent.wm
    torch.manual_seed(2)
    with torch.no_grad():  # context predictions: symexp of the decoded posterior
        h, z, *_ = wm.observe(wm.encoder({"vector": batch["obs"]["vector"][:, :4]}),
                              batch["action"][:, :4], batch["is_first"][:, :4])
        dec = symexp(wm.decoder(wm.feat(h, z))["vector"]).numpy()
    np.testing.assert_allclose(res.pred["vector"][:, :4], dec, rtol=1e-5, atol=1e-6)
    renderer = video.StateRenderer("CartPole-v1", downsample=2)
    try:
        frames = res.frames(renderer)[:, video.LABEL_H:]  # (rendered states: not scaled)
        assert frames.shape == (12, 2 * (200 + video.BAR), 900, 3)
        np.testing.assert_array_equal(frames[5, :200, :300], renderer.render(truth[0, 5]))
        np.testing.assert_array_equal(frames[5, :200, 300:600],
                                      renderer.render(res.pred["vector"][0, 5]))
        # the renderer really draws the given state: a cart moved right is drawn elsewhere
        moved = truth[0, 5].copy()
        moved[0] += 1.0
        assert not np.array_equal(renderer.render(moved), renderer.render(truth[0, 5]))
    finally:
        renderer.close()
    with pytest.raises(ValueError, match="cannot render a given state of .*DotEnv"):
        video.StateRenderer(f"{__name__}:DotEnv")
    # envs whose states cannot be drawn get a plot of truth and prediction per dimension
    png = iio.imread(video.plot_open_loop(res, tmp_path / "vectors.png"))
    assert png.ndim == 3 and png.shape[0] > 4 * 100


def test_the_dream_plot_draws_every_vector_key_up_to_its_panel_limit(tmp_path, monkeypatch):
    """A Dict observation's keys each get their dimensions' panels (not only the first key);
    past PLOT_PANELS dimensions the first ones are drawn and the title says how many;
    key= draws one key."""
    rng = np.random.default_rng(0)

    def result(dims: dict) -> video.OpenLoop:
        data = {k: rng.normal(size=(1, 8, d)) for k, d in dims.items()}
        return video.OpenLoop(3, 5, data, {k: v + 0.1 for k, v in data.items()},
                              vectors=list(dims))

    drawn = []
    save = video.save_figure
    monkeypatch.setattr("lucid.video.save_figure", lambda fig, path, dpi: (
        drawn.append(([ax.get_ylabel() for ax in fig.axes], fig.axes[0].get_title(),
                      fig.axes[1].lines[1].get_ydata().tolist())), save(fig, path, dpi))[1])
    two = result({"near": 2, "pos": 3})
    video.plot_open_loop(two, tmp_path / "two.png")
    assert drawn[-1][:2] == (["near[0]", "near[1]", "pos[0]", "pos[1]", "pos[2]"], "")
    assert drawn[-1][2] == two.pred["near"][0, :, 1].tolist()  # the prediction, per dimension
    video.plot_open_loop(two, tmp_path / "pos.png", key="pos")
    assert drawn[-1][0] == ["pos[0]", "pos[1]", "pos[2]"]
    video.plot_open_loop(result({"a": 20, "b": 10}), tmp_path / "many.png")
    labels, title, _ = drawn[-1]
    assert labels == [f"a[{d}]" for d in range(20)] + [f"b[{d}]" for d in range(4)]
    assert title.startswith("the first 24 of 30 dimensions")


# --------------------------------------------------------------------------- plot, report


def test_an_evaluation_is_one_point_against_steps_or_wall_time():
    rows = [{"env_steps": 100, "wall_time": 10.0, "return": 1.0},
            {"env_steps": 100, "wall_time": 10.5, "return": 3.0},
            {"env_steps": 200, "wall_time": 20.0, "return": 5.0}]
    assert eval_points(rows) == [(100.0, 2.0), (200.0, 5.0)]
    assert eval_points(rows, "wall_time") == [(10.25, 2.0), (20.0, 5.0)]


def test_a_group_curve_averages_the_runs_that_reached_each_x_and_nothing_past_them():
    """Running means over the last `window` episodes; the common grid spans every run's x
    range, each run counts only inside its own range, the std band is mean +- one std;
    a run without the x key is left out."""
    from lucid.plot import Run, running_mean
    np.testing.assert_allclose(running_mean(np.array([1.0, 2, 3, 4]), 2), [1, 1.5, 2.5, 3.5])

    def run(xs, y, x="env_steps"):
        return Run(Path("r"), {}, episodes=[{x: v, "return": y} for v in xs])

    a, b = run([0, 100], 1.0), run([50, 150], 3.0)
    grid, mean, low, high, count = group_curve([run([10, 20], 9.0, x="updates"), a, b],
                                               window=1, points=7, band="std")
    np.testing.assert_allclose(grid, [0, 25, 50, 75, 100, 125, 150])
    np.testing.assert_array_equal(count, [1, 1, 2, 2, 2, 1, 1])
    np.testing.assert_allclose(mean, [1, 1, 2, 2, 2, 3, 3])
    np.testing.assert_allclose(high - mean, [0, 0, 1, 1, 1, 0, 0])
    np.testing.assert_allclose(mean - low, [0, 0, 1, 1, 1, 0, 0])


def test_plot_groups_seeds_of_one_config(runs, tmp_path):
    other = tmp_path / "other"  # a third run of another config: its files, edited
    shutil.copytree(runs[1], other)
    cfg = (other / "config.yaml").read_text().replace("train_ratio: 8", "train_ratio: 16")
    (other / "config.yaml").write_text(cfg)
    loaded = [load_run(r) for r in (*runs, other)]
    groups = group_runs(loaded)
    assert sorted(len(v) for v in groups.values()) == [1, 2]
    two = next(v for v in groups.values() if len(v) == 2)
    assert {r.path for r in two} == set(runs)
    label = next(k for k, v in groups.items() if len(v) == 2)
    assert "train.train_ratio=8" in label and "2 seeds" in label
    resumed = tmp_path / "resumed"  # a seed resumed with another --steps, without videos
    shutil.copytree(runs[1], resumed)
    cfg = (resumed / "config.yaml").read_text()
    assert "videos: true" in cfg and "\n  steps: " in cfg
    cfg = cfg.replace("videos: true", "videos: false").replace("\n  steps: ", "\n  steps: 9")
    (resumed / "config.yaml").write_text(cfg)
    assert [len(v) for v in group_runs([load_run(r) for r in (*runs, resumed)]).values()] == [3]
    far = tmp_path / "far"  # another env and four other keys: the env first, three keys at most
    shutil.copytree(runs[1], far)
    cfg = (far / "config.yaml").read_text().replace("id: CartPole-v1", "id: Pendulum-v1")
    for old, new in (("train_ratio: 8", "train_ratio: 4"), ("batch_size: 2", "batch_size: 3"),
                     ("batch_length: 8", "batch_length: 9"), ("horizon: 5", "horizon: 4")):
        assert old in cfg
        cfg = cfg.replace(old, new)
    (far / "config.yaml").write_text(cfg)
    labels = list(group_runs([load_run(runs[0]), load_run(far)]))
    assert [lab.split(",")[0] for lab in labels] == ["CartPole-v1", "Pendulum-v1"], labels
    assert all(", +2 more (1 seed)" in lab for lab in labels), labels
    named = list(group_runs([load_run(runs[0]), load_run(far)], ["ours", "theirs"]))
    assert named == ["ours (1 seed)", "theirs (1 seed)"]
    with pytest.raises(ValueError, match="1 label.* for 2 group"):
        group_runs([load_run(runs[0]), load_run(far)], ["ours"])
    grid, mean, low, high, count = group_curve(two)
    ok = count == 2
    assert ok.any() and np.all(low[ok] <= mean[ok] + 1e-9) and np.all(mean[ok] <= high[ok] + 1e-9)
    png = plot_runs([*runs, other], tmp_path / "curves.png")
    img = iio.imread(png)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 300
    assert plot_runs(runs, tmp_path / "wall.png", x="wall_time", band="std").exists()
    with pytest.raises(ValueError, match="x must be"):
        plot_runs(runs, tmp_path / "bad.png", x="updates")
    young = tmp_path / "young"  # a run before its first finished episode: no empty picture
    young.mkdir()
    shutil.copy(runs[0] / "config.yaml", young)
    (young / "episodes.jsonl").write_text("")
    with pytest.raises(ValueError, match="no finished episodes to plot in .*young"):
        plot_runs([young], tmp_path / "empty.png")
    assert not (tmp_path / "empty.png").exists()
    assert plot_runs([young, runs[0]], tmp_path / "one.png").exists()  # one with data will do


def _synthetic_run(path, seed, overrides=(), drop=(), loss=1.0):
    """A run directory written by hand: the config of `overrides` (its keys in `drop` left
    out of config.yaml, as an older lucid wrote it), 20 training episodes of return
    env_steps / 10 and length 5, one greedy evaluation, and metric rows whose
    world_model/loss is `loss` (none in the first row: the prefill)."""
    path.mkdir(parents=True)
    tree = as_dict(make_config("cpu-control", [f"run.seed={seed}", *overrides]))
    for key in drop:
        section, name = key.split(".")
        del tree[section][name]
    (path / "config.yaml").write_text(yaml.safe_dump(tree))
    eps = [{"env_steps": 10 * i, "return": float(i), "length": 5, "wall_time": i / 2,
            "eval": False} for i in range(1, 21)]
    eps.append({"env_steps": 200, "return": 50.0, "length": 9, "wall_time": 11.0,
                "eval": True, "policy": "greedy"})
    (path / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
    rows = [{"env_steps": 50 * i, "wall_time": 2.5 * i, "updates": 3 * i,
             **({"world_model/loss": loss} if i else {})} for i in range(5)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_plot_groups_runs_by_tag_and_labels_them_by_it(tmp_path):
    """run.tag splits groups; a group is labeled by its tag ("untagged" for ""), and a run
    from before run.tag existed is untagged."""
    base = [_synthetic_run(tmp_path / f"b{s}", s) for s in (0, 1)]
    old = _synthetic_run(tmp_path / "old", 2, drop=["run.tag"])
    assert "tag" not in (old / "config.yaml").read_text()
    mine = [_synthetic_run(tmp_path / f"m{s}", s, ["run.tag=my-actor"]) for s in (0, 1)]
    groups = group_runs([load_run(r) for r in (*base, old, *mine)])
    assert {k: {r.path for r in v} for k, v in groups.items()} == {
        "untagged (3 seeds)": {*base, old}, "my-actor (2 seeds)": set(mine)}
    fast = _synthetic_run(tmp_path / "fast", 0, ["run.tag=my-actor", "train.train_ratio=64"])
    assert list(group_runs([load_run(r) for r in (base[0], mine[0], fast)])) == [
        "untagged, train.train_ratio=32.0 (1 seed)", "my-actor, train.train_ratio=32.0 (1 seed)",
        "my-actor, train.train_ratio=64.0 (1 seed)"]
    assert list(group_runs([load_run(r) for r in mine])) == ["CartPole-v1, my-actor (2 seeds)"]
    assert list(group_runs([load_run(r) for r in base])) == ["CartPole-v1 (2 seeds)"]
    # an Agent subclass by its file's name (docs/extending.md's example), lucid's by its own
    (tmp_path / "proj").mkdir()
    agent = f"{tmp_path / 'proj' / 'my_agent.py'}:MyAgent"
    small = _synthetic_run(tmp_path / "small", 0, ["run.tag=small-actor", f"model.agent={agent}"])
    tagged = _synthetic_run(tmp_path / "tagged", 0, ["run.tag=baseline"])
    assert list(group_runs([load_run(r) for r in (tagged, small)])) == [
        "baseline, model.agent=lucid.agent:Agent (1 seed)",
        "small-actor, model.agent=my_agent.py:MyAgent (1 seed)"]


def test_plot_labels_groups_that_three_keys_leave_alike_by_every_differing_key(tmp_path):
    """Four keys differ; the first three (env, tag, then by name) are the same for two
    groups: those two are labeled by all four, the others by three and a count."""
    keys = ["run.tag=t", "train.actor_lr=0.001", "train.batch_size=4"]
    a = _synthetic_run(tmp_path / "a", 0, [*keys, "train.free_nats=0.5"])
    b = _synthetic_run(tmp_path / "b", 0, [*keys, "train.free_nats=2.0"])
    c = _synthetic_run(tmp_path / "c", 0)
    assert list(group_runs([load_run(r) for r in (a, b, c)])) == [
        "t, train.actor_lr=0.001, train.batch_size=4, train.free_nats=0.5 (1 seed)",
        "t, train.actor_lr=0.001, train.batch_size=4, train.free_nats=2.0 (1 seed)",
        "untagged, train.actor_lr=0.0003, train.batch_size=8, +1 more (1 seed)"]


def test_plot_draws_a_curve_of_one_point_as_a_marker(tmp_path, monkeypatch):
    """A short run logs one metrics row: its curve is one point, drawn as a marker (a line
    of one point draws nothing); longer curves stay lines."""
    one = _synthetic_run(tmp_path / "one", 0)
    rows = [json.loads(line) for line in open(one / "metrics.jsonl")]
    (one / "metrics.jsonl").write_text(json.dumps(rows[1]) + "\n")
    markers = []
    save = video.save_figure
    monkeypatch.setattr("lucid.plot.save_figure", lambda fig, path, dpi: (
        markers.append([ln.get_marker() for ln in fig.axes[0].lines]), save(fig, path, dpi))[1])
    plot_runs([one], tmp_path / "one.png", y="world_model/loss")
    plot_runs([_synthetic_run(tmp_path / "many", 0)], tmp_path / "many.png",
              y="world_model/loss")
    assert markers == [["o"], ["None"]]


def test_plot_skips_corrupt_lines_and_marks_greedy_evaluations_only(tmp_path, monkeypatch):
    """A corrupt line anywhere in episodes.jsonl (not only a torn last one) costs that row
    alone; the evaluation markers are the greedy episodes' mean, sampled ones left out."""
    run = _synthetic_run(tmp_path / "r", 0)
    lines = (run / "episodes.jsonl").read_text().splitlines()
    sampled = {"env_steps": 200, "return": -70.0, "length": 9, "wall_time": 12.0,
               "eval": True, "policy": "sampled"}
    (run / "episodes.jsonl").write_text("\n".join(
        [*lines[:5], '{"env_steps": 6', *lines[5:], json.dumps(sampled), '{"ret']) + "\n")
    loaded = load_run(run)
    assert [e["return"] for e in loaded.episodes] == [float(i) for i in range(1, 21)]
    assert [e["policy"] for e in loaded.eval_rows] == ["greedy", "sampled"]
    drawn = []
    save = video.save_figure
    monkeypatch.setattr("lucid.plot.save_figure", lambda fig, path, dpi: (
        drawn.extend((ln.get_label(), list(ln.get_ydata())) for ln in fig.axes[0].lines),
        save(fig, path, dpi))[1])
    plot_runs([run], tmp_path / "p.png")
    assert drawn[-1] == ("CartPole-v1 (1 seed): eval", [50.0])


def test_plot_reads_a_key_missing_from_an_old_config_as_its_default(tmp_path):
    new = _synthetic_run(tmp_path / "new", 0)
    old = _synthetic_run(tmp_path / "old", 1, drop=["train.actor_baseline_grad"])
    other = _synthetic_run(tmp_path / "other", 2, ["train.actor_baseline_grad=true"])
    assert load_run(old).config["train.actor_baseline_grad"] is False
    assert list(group_runs([load_run(r) for r in (new, old)])) == ["CartPole-v1 (2 seeds)"]
    assert list(group_runs([load_run(r) for r in (old, other)])) == [
        "train.actor_baseline_grad=False (1 seed)", "train.actor_baseline_grad=True (1 seed)"]
    # the dataclass default (XS), not the run's preset's (cpu-control: mini): a key an older
    # file lacks did not exist when it was written
    older = _synthetic_run(tmp_path / "older", 3, drop=["model.size"])
    assert load_run(older).config["model.size"] == "XS"
    # a key this lucid no longer has (a newer or older lucid's) shapes nothing; env kwargs do
    gone = _synthetic_run(tmp_path / "gone", 4)
    cfg_file = gone / "config.yaml"
    tree = yaml.safe_load(cfg_file.read_text())
    tree["train"]["removed_key"] = 3
    tree["env"]["kwargs"] = {"size": 8}
    cfg_file.write_text(yaml.safe_dump(tree))
    assert "train.removed_key" not in load_run(gone).config
    assert load_run(gone).config["env.kwargs.size"] == 8
    del tree["env"]["kwargs"]
    cfg_file.write_text(yaml.safe_dump(tree))
    assert list(group_runs([load_run(r) for r in (new, gone)])) == ["CartPole-v1 (2 seeds)"]
    bare = tmp_path / "bare"  # no config.yaml at all: no config, not the defaults
    bare.mkdir()
    shutil.copy(new / "episodes.jsonl", bare)
    assert load_run(bare).config == {}


def test_plot_any_metric_or_episode_key(tmp_path, monkeypatch):
    runs = [_synthetic_run(tmp_path / f"s{s}", s, loss=loss) for s, loss in ((0, 2.0), (1, 4.0))]
    loaded = [load_run(r) for r in runs]
    grid, mean, low, high, count = group_curve(loaded, y="world_model/loss")
    assert grid[0] == 50 and grid[-1] == 200  # the rows that have it, as logged
    assert np.allclose(mean, 3.0) and np.allclose(low, 2.0) and np.allclose(high, 4.0)
    grid, mean, *_ = group_curve(loaded, x="wall_time", y="length")
    assert grid[0] == 0.5 and np.allclose(mean, 5.0)
    ylabels = []
    save = video.save_figure  # lucid.plot's, which plot_runs calls to write the figure
    monkeypatch.setattr("lucid.plot.save_figure", lambda fig, path, dpi: (
        ylabels.append(fig.axes[0].get_ylabel()), save(fig, path, dpi))[1])
    for y in ("world_model/loss", "updates", "length", "return"):
        assert iio.imread(plot_runs(runs, tmp_path / "c.png", y=y)).ndim == 3
    assert ylabels == ["world_model/loss", "updates", "episode length (mean of last 10)",
                       "episode return (mean of last 10)"]
    with pytest.raises(ValueError, match=r"'world_model/los'.*did you mean 'world_model/loss'"
                                         r".*one of: return, length, updates, world_model/loss$"):
        plot_runs(runs, tmp_path / "bad.png", y="world_model/los")
    r = cli.invoke(app, ["plot", *map(str, runs), "--y", "world_model/loss", "--x", "wall_time",
                         "--out", str(tmp_path / "cli.png")])
    assert r.exit_code == 0 and (tmp_path / "cli.png").exists(), r.output
    r = cli.invoke(app, ["plot", *map(str, runs), "--y", "loss", "--out", str(tmp_path / "x.png")])
    assert r.exit_code == 2 and "world_model/loss" in r.output and not (tmp_path / "x.png").exists()


def test_plot_labels_name_the_env_then_the_tag_and_show_what_a_run_lacks(tmp_path):
    """Labels: the env (a file's name, not its path), the tag, then other keys by name; a
    run without config.yaml shows "-" for what it lacks, and alone is named by its
    directory; groups given one name twice stay two curves."""
    env = f"{tmp_path / 'proj' / 'my_env.py'}:MyEnv"
    a = _synthetic_run(tmp_path / "a", 0, ["run.tag=mine", "model.size=nano"])
    b = _synthetic_run(tmp_path / "b", 0, [f"env.id={env}"])
    assert list(group_runs([load_run(r) for r in (a, b)])) == [
        "CartPole-v1, mine, model.size=nano (1 seed)",
        "my_env.py:MyEnv, untagged, model.size=mini (1 seed)"]
    assert list(group_runs([load_run(r) for r in (a, b)], ["same", "same"])) == [
        "same (1 seed)", "same (1 seed)'"]
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(a / "episodes.jsonl", bare)
    assert list(group_runs([load_run(bare)])) == ["bare (1 seed)"]
    lacking, full = group_runs([load_run(bare), load_run(a)])
    assert lacking.startswith("-, untagged, env.asynchronous=-, +"), lacking
    assert full.startswith("CartPole-v1, mine, env.asynchronous=False, +"), full


def test_plot_groups_configs_that_differ_only_in_how_their_files_are_written(tmp_path):
    """The order of config.yaml's keys and list values (env kwargs) do not split a group; an
    empty config.yaml is no config; a directory without episodes.jsonl is not a run."""
    runs = [_synthetic_run(tmp_path / f"s{s}", s) for s in (0, 1)]
    for run, kwargs in zip(runs, ({"size": [8, 8], "mode": 1}, {"mode": 1, "size": [8, 8]})):
        tree = yaml.safe_load((run / "config.yaml").read_text())
        tree["env"]["kwargs"] = kwargs
        (run / "config.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    assert list(group_runs([load_run(r) for r in runs])) == ["CartPole-v1 (2 seeds)"]
    (runs[0] / "config.yaml").write_text("")
    assert load_run(runs[0]).config == {}
    with pytest.raises(FileNotFoundError, match="has no episodes.jsonl; is it a lucid run"):
        load_run(tmp_path)


class _Page(HTMLParser):
    VOID = {"meta", "img", "source", "br", "hr", "link", "input"}

    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.tags, self.text = [], [], [], {}
        self._current = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)
        self._current = dict(attrs).get("id")

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unexpected </{tag}> with open {self.stack}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        if self._current:
            self.text[self._current] = self.text.get(self._current, "") + data


def test_report_is_one_self_contained_page(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    clip = video.write_video(run / "videos" / "dream.mp4",
                             np.zeros((4, 16, 16, 3), np.uint8), fps=4)
    page_path = write_report(run)
    assert page_path == run / "report.html"
    page = _Page()
    page.feed(page_path.read_text())
    page.close()
    assert not page.errors and page.stack == []  # every element closed, in order
    assert "size: nano" in page.text["config"] and "train_ratio: 8" in page.text["config"]
    srcs = [a.get("src", "") for t, a in page.tags if t in ("img", "source")]
    assert all(s.startswith("data:") for s in srcs)  # nothing fetched from elsewhere
    assert not [a for t, a in page.tags if t in ("script", "link")]
    curve = next(a for t, a in page.tags if t == "img" and a.get("id") == "learning-curve")
    png = base64.b64decode(curve["src"].split(",", 1)[1])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and iio.imread(png).ndim == 3
    assert any(t == "video" for t, _ in page.tags)
    mp4 = next(a["src"] for t, a in page.tags if t == "source")
    assert base64.b64decode(mp4.split(",", 1)[1]) == clip.read_bytes()
    html_text = page_path.read_text()
    assert f"<td>{STEPS}</td>" in html_text  # final env steps from metrics.jsonl
    # the diagnostics over time: one panel per logged group of metrics
    diag = next(a for t, a in page.tags if t == "img" and a.get("id") == "diagnostics")
    grid = iio.imread(base64.b64decode(diag["src"].split(",", 1)[1]))
    assert grid.shape[0] > 600  # four rows of panels
    # the caption says what the page shows: this run made no evaluation (run.eval_every=0)
    assert "circles" not in html_text and "no evaluation episodes" in html_text
    with open(run / "episodes.jsonl", "a") as f:
        f.write(json.dumps({"env_steps": STEPS, "return": 9.0, "length": 9, "eval": True,
                            "policy": "greedy"}) + "\n")
    assert "circles: greedy evaluation episodes" in write_report(run).read_text()


def test_diagnostics_plot_the_logged_metrics_and_leave_out_the_rest(tmp_path):
    from lucid.plot import plot_diagnostics
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"env_steps": 100 * i, "world_model/kl": 1.0 / i,
                    "perf/updates_per_s": 5.0}) + "\n" for i in range(1, 6)))
    png = plot_diagnostics(tmp_path, tmp_path / "d.png")
    one_row = iio.imread(png)  # two panels: KL and updates/s, side by side
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"env_steps": 100 * i, "world_model/kl": 1.0 / i, "actor/entropy": 1.0,
                    "critic/value_mean": 0.5, "perf/updates_per_s": 5.0}) + "\n"
        for i in range(1, 6)))
    two_rows = iio.imread(plot_diagnostics(tmp_path, tmp_path / "d2.png"))
    assert two_rows.shape[0] > 1.8 * one_row.shape[0] and two_rows.shape[1] == one_row.shape[1]
    (tmp_path / "metrics.jsonl").write_text('{"env_steps": 1, "something/else": 2.0}\n')
    assert plot_diagnostics(tmp_path, tmp_path / "d3.png") is None


def test_report_orders_videos_by_step_and_embeds_those_of_a_few_steps(runs, tmp_path):
    """Videos of 7 steps: the page embeds those of steps 1, 3, 6 and 10 (first, last, evenly
    spaced), in step order with the evaluation before the dream, then a video without a step
    in its name; the others are named, not embedded."""
    import re
    from lucid.report import MAX_VIDEO_STEPS
    assert MAX_VIDEO_STEPS == 4
    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    shutil.rmtree(run / "videos", ignore_errors=True)
    (run / "videos").mkdir()
    frame = np.zeros((8, 8, 3), np.uint8)
    for step in (7, 10, 1, 2, 3, 4, 6):  # written out of order; at a step, eval before dream
        for kind in ("dream", "eval"):
            iio.imwrite(run / "videos" / f"{kind}-{step:09d}.png", frame)
    iio.imwrite(run / "videos" / "mine.png", frame)
    text = write_report(run).read_text()
    shown = re.findall(r"<figcaption>([^<]*\.png)</figcaption>", text)
    assert shown == [f"{k}-{s:09d}.png" for s in (1, 3, 6, 10) for k in ("eval", "dream")] \
        + ["mine.png"]
    assert text.count('src="data:image/png') == len(shown) + 2  # and curve and diagnostics
    named = re.search(r"Not embedded.*?</p>", text).group(0)
    assert re.findall(r"<code>([^<]*)</code>", named)[1:] == \
        [f"{k}-{s:09d}.png" for s in (2, 4, 7) for k in ("eval", "dream")]


def test_summary_counts_train_episodes_without_cut_ones_and_the_last_greedy_evaluation(
        tmp_path):
    """summary(): the last metrics row's counters; train episodes without the cut ones, the
    mean of their last 10 returns and the best one; the cut ones counted apart; the mean of
    the greedy evaluation episodes at the latest step that has any (sampled ones ignored)."""
    from lucid.report import summary
    train = [5, 30, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    rows = [{"env_steps": 10 * i, "return": r} for i, r in enumerate(train)]
    rows.insert(4, {"env_steps": 45, "return": 100, "cut": True})
    rows += [{"env_steps": 50, "return": r, "eval": True, "policy": "greedy"} for r in (3, 5)]
    rows += [{"env_steps": 100, "return": r, "eval": True} for r in (8, 10)]  # greedy: default
    rows += [{"env_steps": s, "return": r, "eval": True, "policy": "sampled"}
             for s, r in ((100, 50), (150, 70))]
    (tmp_path / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = [{"env_steps": 60, "updates": 3, "episodes": 5, "wall_time": 1.5},
               {"env_steps": 150, "updates": 9, "episodes": 15, "wall_time": 4.25, "loss": 2.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    assert summary(tmp_path) == {
        "env_steps": 150, "updates": 9, "episodes": 15, "wall_time": 4.25,
        "train episodes": 12, "return, last 10 train episodes (mean)": np.mean(train[-10:]),
        "return, best train episode": 30.0,
        "episodes cut short by an env crash (left out above)": 1,
        "eval return at last evaluation (mean)": 9.0, "eval: env steps of last evaluation": 100}
    text = write_report(tmp_path).read_text()  # no config.yaml: still a run directory
    assert "<th>loss</th><td>2</td>" in text  # the last metrics row, floats as 4 digits
    assert text.count("<td>4.25</td>") == 2 and "<td>5.5</td>" in text
    (tmp_path / "episodes.jsonl").write_text("")
    assert summary(tmp_path) == {"env_steps": 150, "updates": 9, "episodes": 15,
                                 "wall_time": 4.25}


def test_of_six_video_steps_the_first_last_and_nearest_evenly_spaced_are_embedded():
    """Steps 10..60: evenly spaced positions 0, 1.67, 3.33, 5 round to steps 10, 30, 40, 60;
    the videos of four steps or fewer are all embedded (not only four videos)."""
    from lucid.report import _videos_to_embed
    six = [Path(f"eval-{s:09d}.mp4") for s in (60, 50, 40, 30, 20, 10)]
    shown, left = _videos_to_embed(six)
    assert [video.video_step(v) for v in shown] == [10, 30, 40, 60]
    assert [video.video_step(v) for v in left] == [20, 50]
    three = [Path(f"{k}-{s:09d}.mp4") for s in (30, 20, 10) for k in ("dream", "eval")]
    assert _videos_to_embed(three) == (
        [Path(f"{k}-{s:09d}.mp4") for s in (10, 20, 30) for k in ("eval", "dream")], [])


class Blind(gym.Env):
    """Vector observations and no picture: render() is gymnasium's NotImplementedError."""
    observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode, self.t = render_mode, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(3, 0.1 * self.t, np.float32), float(action), self.t == 6, False, {}


def test_an_env_without_pictures_still_gets_its_dream_and_a_clear_eval_video_error(tmp_path):
    cfg = make_config("cpu-control", [
        f"env.id={__name__}:Blind", "model.size=nano", "train.prefill=32", "run.steps=48",
        "train.batch_size=2", "train.batch_length=8", "train.train_ratio=8", "train.horizon=3",
        "run.progress=false", "run.log_every=0", f"run.run_dir={tmp_path / 'run'}"])
    tr = Trainer(cfg)
    try:
        tr.run()
        with pytest.warns(UserWarning, match="no evaluation video.*NotImplementedError"):
            paths = video.log_videos(tr, None, tr.counters["env_steps"])
    finally:
        tr.close()
    assert set(paths) == {"dream"} and paths["dream"].suffix == ".png"  # a plot: no pictures
    r = cli.invoke(app, ["eval", str(tmp_path / "run"), "--episodes", "1", "--video"])
    assert r.exit_code == 2 and "cannot be drawn for a video" in r.output, r.output
    assert "Traceback" not in r.output and not list((tmp_path / "run" / "videos").glob("*.mp4"))


# --------------------------------------------------------------------------- CLI


def test_cli_eval_video_dream_plot_report(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    r = cli.invoke(app, ["eval", str(run), "--episodes", "1", "--video"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output.strip().splitlines()[-1])
    (path,) = out["videos"]
    frames = video.read_video(path)
    assert path.startswith(str(run / "videos")) and frames.shape == (out["returns"][0] + 1,
                                                                     400, 600, 3)
    assert out["lengths"] == [len(frames) - 1]  # CartPole: reward 1 per step, frames + reset
    r = cli.invoke(app, ["dream", str(run), "--horizon", "6", "--context", "3", "--rows", "2",
                         "--out", str(tmp_path / "dream.gif")])
    assert r.exit_code == 0, r.output
    assert video.read_video(tmp_path / "dream.gif").shape \
        == (9, video.LABEL_H + 2 * (200 + video.BAR), 900, 3)
    for too_long in (["--horizon", "5000"], ["--context", "5000"]):  # either one: both named
        r = cli.invoke(app, ["dream", str(run), *too_long])
        assert r.exit_code == 2 and "make --context plus --horizon at most" in r.output, r.output
    # default names never overwrite an earlier video of the same checkpoint
    first = Path(path).read_bytes()
    r = cli.invoke(app, ["eval", str(run), "--episodes", "1", "--video", "--sampled"])
    assert r.exit_code == 0, r.output
    (again,) = json.loads(r.output.strip().splitlines()[-1])["videos"]
    assert again == path.replace("-ep0.mp4", "-ep0-2.mp4") and Path(path).read_bytes() == first
    dreams = []
    for _ in range(2):
        r = cli.invoke(app, ["dream", str(run), "--horizon", "4", "--context", "2", "--rows", "1"])
        assert r.exit_code == 0, r.output
        dreams.append(Path(json.loads(r.output.strip().splitlines()[-1])["video"]))
    assert dreams[1] == dreams[0].with_name(dreams[0].stem + "-2.mp4")
    assert all(video.read_video(d).shape[0] == 6 for d in dreams)
    r = cli.invoke(app, ["plot", *map(str, runs), "--out", str(tmp_path / "c.png"),
                         "--x", "wall_time"])
    assert r.exit_code == 0, r.output
    assert iio.imread(tmp_path / "c.png").ndim == 3
    r = cli.invoke(app, ["report", str(run)])
    assert r.exit_code == 0, r.output
    text = (run / "report.html").read_text()
    assert text.count("<video") == len(list((run / "videos").glob("*.mp4"))) == 4
    assert "data:video/mp4;base64," in text
    r = cli.invoke(app, ["report", str(tmp_path / "missing")])
    assert r.exit_code == 2


def test_dream_of_a_vector_env_that_cannot_draw_its_states_is_a_plot(runs, tmp_path,
                                                                      monkeypatch):
    """CountEnv takes no render_mode: `lucid dream` plots truth and prediction per dimension
    (a video of it is refused by name); a CartPole run gives the plot when asked."""
    monkeypatch.chdir(Path(__file__).parent)  # envs_for_tests is found from here
    cfg = make_config("cpu-control", [
        "env.id=envs_for_tests:CountEnv", "env.kwargs.length=20", "model.size=nano",
        "train.prefill=30", "run.steps=40", "train.batch_size=2", "train.batch_length=8",
        "train.train_ratio=8", "run.progress=false", "run.log_every=0", "run.videos=false",
        f"run.run_dir={tmp_path / 'count'}"])
    tr = Trainer(cfg)
    with tr:
        tr.run()
    run = str(tmp_path / "count")
    r = cli.invoke(app, ["dream", run, "--horizon", "6", "--context", "2"])
    assert r.exit_code == 0, r.output
    plot = Path(json.loads(r.output.strip().splitlines()[-1])["plot"])
    assert plot.parent == tmp_path / "count" / "videos" and plot.suffix == ".png"
    assert iio.imread(plot).ndim == 3
    r = cli.invoke(app, ["dream", run, "--horizon", "6", "--out", str(tmp_path / "d.mp4")])
    assert r.exit_code == 2 and "cannot be drawn" in r.output and "NAME.png" in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    with pytest.raises(ValueError, match="plot_open_loop"):
        video.dream_video(load_to_act(run), horizon=4, context=2)
    r = cli.invoke(app, ["dream", str(runs[0]), "--horizon", "4",
                         "--out", str(tmp_path / "c.png")])
    assert r.exit_code == 0, r.output
    assert iio.imread(tmp_path / "c.png").ndim == 3


def test_finish_run_writes_curve_videos_and_report(trainer, tmp_path):
    """What train.py calls at the end of a run (and `log_videos` periodically)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter
    from lucid.report import finish_run
    run = tmp_path / "run"
    shutil.copytree(trainer.run_dir, run)
    old = trainer.run_dir
    trainer.run_dir = run
    try:
        writer = SummaryWriter(str(run / "tb"))
        rng = torch.get_rng_state()
        out = finish_run(trainer, writer, horizon=10)
        writer.close()
        assert torch.equal(torch.get_rng_state(), rng)  # training's random stream untouched
    finally:
        trainer.run_dir = old
    assert set(out) == {"curves", "eval", "dream", "report"}
    assert len(video.read_video(out["dream"])) == 5 + 10  # context + horizon
    acc = EventAccumulator(str(_media(run / "tb")), size_guidance={"images": 0})
    acc.Reload()
    assert {"eval/video", "world_model/open_loop"} <= set(acc.Tags()["images"])
    assert all(p.exists() for p in out.values())
    assert out["dream"].parent == run / "videos" and out["dream"].suffix == ".mp4"
    assert (run / "report.html").read_text().count("<video") == 2
    # where run.video_every made them at the last step, the end of the run does not again
    trainer.run_dir = run
    trainer.videos_logged_at = trainer.counters["env_steps"]
    try:
        again = finish_run(trainer, None, horizon=10)
    finally:
        trainer.run_dir, trainer.videos_logged_at = old, None
    assert set(again) == {"curves", "report"}
    assert (run / "report.html").read_text().count("<video") == 2  # the ones made before


def test_an_end_of_run_artifact_that_fails_only_warns(tmp_path):
    """finish_run never raises: here the curve and the report cannot be made (an empty
    directory), each failure is a warning and nothing is returned."""
    from types import SimpleNamespace
    from lucid.report import finish_run
    tr = SimpleNamespace(run_dir=tmp_path, videos_logged_at=None, counters={"env_steps": 0})
    with pytest.warns(UserWarning) as got:
        assert finish_run(tr, videos=False) == {}
    assert [str(w.message).split(":")[0] for w in got] == [
        "could not write the run's curves", "could not write the run's report"]


def _chromium():
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome",
                                           "google-chrome-stable", "chrome") if shutil.which(n)),
                None)


@pytest.mark.skipif(_chromium() is None, reason="no headless Chromium on this machine")
def test_report_renders_in_headless_chromium(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    video.write_video(run / "videos" / "dream.mp4", np.zeros((4, 16, 16, 3), np.uint8), fps=4)
    page = write_report(run)
    shot = tmp_path / "shot.png"
    base = [_chromium(), "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
            "--window-size=1200,1600"]
    done = run_grouped([*base, f"--screenshot={shot}", page.as_uri()], timeout=60)
    assert done.returncode == 0, done.stderr
    img = iio.imread(shot)
    assert img.shape[:2] == (1600, 1200) and img.std() > 0  # something was drawn
    done = run_grouped([*base, "--dump-dom", page.as_uri()], timeout=60)
    assert done.returncode == 0, done.stderr
    dom = done.stdout
    assert 'id="learning-curve"' in dom and "<video" in dom


def test_periodic_videos_fall_every_video_every_steps_and_the_end_does_not_repeat_them(
        tmp_path, capsys):
    """run.video_every=20 over 60 env steps with the end-of-run videos asked for: an
    evaluation video and a dream at 20, 40 and 60 env steps, each once (files and
    TensorBoard), none in between, and the end of the run, at a step that already has its
    videos, makes no more; a resume to 70 then makes the end's at 70."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run_dir = tmp_path / "run"
    cfg = make_config("cpu-control", [
        "model.size=nano", "train.prefill=1000", "run.steps=60", "run.video_every=20",
        "run.progress=false", f"run.run_dir={run_dir}"])  # random actions: fast steps
    with Trainer(cfg) as tr:
        tr.run(end_videos=True)
    names = sorted(p.name for p in (run_dir / "videos").glob("eval-*.mp4"))
    assert names == [f"eval-{s:09d}.mp4" for s in (20, 40, 60)], names
    # at 20 env steps the replay holds 20: a dream of 5 context steps and the 15 left
    assert len(video.read_video(run_dir / "videos" / f"dream-{20:09d}.mp4")) == 20
    assert "end-of-run videos" not in capsys.readouterr().out

    def video_steps():
        acc = EventAccumulator(str(_media(run_dir / "tb")), size_guidance={"images": 0})
        acc.Reload()
        return [e.step for e in acc.Images("eval/video")]

    assert video_steps() == [20, 40, 60]
    with Trainer(make_config("default", run={"steps": 70}), run_dir, resume=True) as again:
        again.run(end_videos=True)
    assert "writing the end-of-run videos" in capsys.readouterr().out
    assert video_steps() == [20, 40, 60, 70]
