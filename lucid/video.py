"""Videos of what the agent does and of what its world model dreams.

- `write_video(path, frames)`: MP4 (H.264 through imageio-ffmpeg) or GIF (Pillow), by suffix.
- `record_episodes(agent, env_id, ...)`: full evaluation episodes with their frames: the env's
  `render_mode="rgb_array"` picture when the observations are vectors, else the image
  observations themselves.
- `open_loop(agent, batch, context, horizon)`: from a replayed (B, T) batch, filter the first
  `context` real steps with the posterior (`WorldModel.observe`), then roll the prior forward
  with the recorded actions only. Image observations give truth | prediction | error panels;
  vector observations of envs that can draw a given state (classic control) are rendered,
  dreamed state beside real state.
- `log_video(writer, tag, frames, step)`: a video in TensorBoard.

Frame convention everywhere: uint8 arrays (T, H, W, 3).
"""

from __future__ import annotations

import importlib.util
import io
import math
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from .plot import pyplot, save_figure
from .seeds import video_seed
from .warn import warn

CONTEXT_COLOR = (40, 170, 60)  # bar under a row while the model still sees observations
DREAM_COLOR = (200, 50, 50)  # bar under a row while it dreams
BAR = 4  # pixel height of that bar
LABEL_H = 18  # pixel height of the strip of column labels above a dream's panels
PANEL_MIN = 192  # image panels are scaled up (nearest neighbour) to at least this many pixels


# --------------------------------------------------------------------------- files


def to_rgb(frame: np.ndarray) -> np.ndarray:
    """(H, W), (H, W, 1), (H, W, 3) or (H, W, 4) in any numeric dtype -> uint8 (H, W, 3)."""
    f = np.asarray(frame)
    if f.dtype != np.uint8:
        f = np.clip(f, 0, 255).astype(np.uint8)
    if f.ndim == 2:
        f = f[..., None]
    if f.shape[-1] == 1:
        f = np.repeat(f, 3, -1)
    elif f.shape[-1] == 2:
        f = np.concatenate([f, f[..., :1]], -1)
    elif f.shape[-1] > 3:
        f = f[..., :3]
    return f


def stack_frames(frames: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    if len(frames) == 0:
        raise ValueError("no frames to write")
    arr = np.stack([to_rgb(f) for f in frames])
    if arr.ndim != 4 or len(arr) == 0:
        raise ValueError(f"expected a non-empty sequence of (H, W, C) frames, got {arr.shape}")
    return arr


class VideoWriter:
    """Append frames one at a time to an .mp4 (streamed to ffmpeg: long episodes need no
    memory) or a .gif (kept until `close`, as Pillow writes GIFs in one go).

    MP4 needs even sides: odd frames get one black row/column added (not resized)."""

    def __init__(self, path: str | Path, fps: float = 30.0):
        self.path = Path(path)
        self.fps = fps
        self.kind = self.path.suffix.lower()
        if self.kind not in (".mp4", ".gif"):
            raise ValueError(f"unknown video format {self.path.suffix!r}; use .mp4 or .gif")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # An unwritable folder fails here as an OSError naming it, not as a broken pipe to
        # ffmpeg once frames arrive.
        try:
            tempfile.TemporaryFile(dir=self.path.parent).close()
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(self.path)) from None
        self._writer = None
        self._frames: list[np.ndarray] = []
        self.count = 0

    def append(self, frame: np.ndarray) -> None:
        f = to_rgb(frame)
        self.count += 1
        if self.kind == ".gif":
            self._frames.append(f)
            return
        h, w, _ = f.shape
        if h % 2 or w % 2:
            f = np.pad(f, ((0, h % 2), (0, w % 2), (0, 0)))
        if self._writer is None:
            import imageio.v2 as iio
            self._writer = iio.get_writer(self.path, fps=self.fps, codec="libx264",
                                          pixelformat="yuv420p", macro_block_size=1, quality=8,
                                          ffmpeg_log_level="error")
        self._writer.append_data(f)

    def close(self) -> Path:
        if self.count == 0:
            raise ValueError(f"no frames were written to {self.path}")
        if self.kind == ".gif":
            import imageio.v2 as iio
            iio.mimsave(self.path, self._frames, duration=1000.0 / self.fps, loop=0)
            self._frames = []
        elif self._writer is not None:
            self._writer.close()
            self._writer = None
        return self.path

    def __enter__(self) -> "VideoWriter":
        return self

    def __exit__(self, *exc) -> None:
        if self.count or exc[0] is None:
            self.close()


def write_video(path: str | Path, frames, fps: float = 30.0) -> Path:
    """Write frames (T, H, W, 3) as .mp4 (H.264, yuv420p) or .gif; returns the path."""
    arr = stack_frames(frames)
    with VideoWriter(path, fps) as w:
        for f in arr:
            w.append(f)
    return Path(path)


def read_video(path: str | Path) -> np.ndarray:
    """All frames of an .mp4 or .gif as uint8 (T, H, W, 3)."""
    import imageio.v2 as iio
    return stack_frames(iio.mimread(Path(path), memtest=False))


def tile(frames: np.ndarray, cols: int | None = None) -> np.ndarray:
    """(N, H, W, 3) -> one (rows·H, cols·W, 3) image, row-major, black where empty."""
    n, h, w, c = frames.shape
    cols = cols or math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    out = np.zeros((rows * h, cols * w, c), np.uint8)
    for i, f in enumerate(frames):
        r, q = divmod(i, cols)
        out[r * h:(r + 1) * h, q * w:(q + 1) * w] = f
    return out


# --------------------------------------------------------------------------- TensorBoard


def has_moviepy() -> bool:
    return importlib.util.find_spec("moviepy") is not None


def _gif_bytes(frames: np.ndarray, fps: float) -> bytes:
    import imageio.v2 as iio
    buf = io.BytesIO()
    iio.mimsave(buf, list(frames), format="GIF", duration=1000.0 / fps, loop=0)
    return buf.getvalue()


def log_video(writer, tag: str, frames, step: int, fps: float = 15.0,
              max_frames: int = 200, max_side: int = 480) -> str:
    """Add a video to a torch `SummaryWriter`; returns how it was stored.

    - "video": `writer.add_video` (needs the moviepy package);
    - "gif": without moviepy, the same kind of record `add_video` writes (an animated GIF in an
      image summary, shown animated in TensorBoard's Images tab), encoded here with Pillow and
      written by torch's public `FileWriter` into `<logdir>/videos`: TensorBoard lists that
      as a run of its own. (A second event file in the writer's own directory would make
      TensorBoard stop reading the scalars' file.)

    A video longer than `max_frames` keeps that many frames evenly spaced over all of it,
    and frames larger than `max_side` pixels are subsampled (every k-th pixel), to keep
    event files small."""
    arr = stack_frames(frames)
    if len(arr) > max_frames:
        arr = arr[np.linspace(0, len(arr) - 1, max_frames).round().astype(int)]
    k = max(1, math.ceil(max(arr.shape[1:3]) / max_side))
    arr = np.ascontiguousarray(arr[:, ::k, ::k])
    if has_moviepy():
        video = torch.from_numpy(arr).permute(0, 3, 1, 2)[None]  # (1, T, C, H, W)
        writer.add_video(tag, video, step, fps=int(round(fps)))
        return "video"
    from tensorboard.compat.proto.summary_pb2 import Summary
    from torch.utils.tensorboard.writer import FileWriter
    _, h, w, c = arr.shape
    image = Summary.Image(height=h, width=w, colorspace=c,
                          encoded_image_string=_gif_bytes(arr, fps))
    media = FileWriter(str(Path(writer.get_logdir()) / "videos"))
    try:
        media.add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)
    finally:
        media.close()
    return "gif"


# --------------------------------------------------------------------------- rendering states


def _angle(c, s):
    return float(np.arctan2(s, c))


# Observation vector -> the env's internal `state`, for the classic-control envs whose
# renderer draws `env.unwrapped.state`. Keyed by the class name of the unwrapped env.
STATE_FROM_OBS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "CartPoleEnv": lambda o: np.asarray(o[:4], np.float64),
    "MountainCarEnv": lambda o: np.asarray(o[:2], np.float64),
    "Continuous_MountainCarEnv": lambda o: np.asarray(o[:2], np.float64),
    "PendulumEnv": lambda o: np.array([_angle(o[0], o[1]), o[2]], np.float64),
    "AcrobotEnv": lambda o: np.array([_angle(o[0], o[1]), _angle(o[2], o[3]), o[4], o[5]],
                                     np.float64),
}


class StateRenderer:
    """Draw arbitrary observation vectors of a classic-control env through its own renderer
    (sets `env.unwrapped.state`, then `env.render()`)."""

    def __init__(self, env_id: str, max_episode_steps: int | None = None, downsample: int = 1):
        from .envs import make_env
        self.downsample = max(1, int(downsample))
        self.env = make_env(env_id, max_episode_steps, render_mode="rgb_array")
        name = type(self.env.unwrapped).__name__
        if name not in STATE_FROM_OBS:
            self.env.close()
            raise ValueError(f"cannot render a given state of {env_id} ({name}); states can be "
                             f"drawn for {', '.join(sorted(STATE_FROM_OBS))}")
        self.to_state = STATE_FROM_OBS[name]
        self.env.reset(seed=0)

    def render(self, obs: np.ndarray) -> np.ndarray:
        self.env.unwrapped.state = self.to_state(np.asarray(obs, np.float64))
        k = self.downsample
        return to_rgb(self.env.render()[::k, ::k])

    def render_many(self, obs: np.ndarray) -> np.ndarray:
        """(..., D) observations -> (..., H, W, 3) frames."""
        lead = obs.shape[:-1]
        flat = obs.reshape(-1, obs.shape[-1])
        frames = np.stack([self.render(o) for o in flat])
        return frames.reshape(*lead, *frames.shape[1:])

    def close(self) -> None:
        self.env.close()


# --------------------------------------------------------------------------- episodes


@dataclass
class Recording:
    frames: np.ndarray | None  # (length + 1, H, W, 3): the first observation, then one per step
    ret: float
    length: int
    path: Path | None = None  # the video file, when the frames were streamed to one


def _obs_frame(arrays: dict[str, np.ndarray], spec) -> np.ndarray:
    """The image observations of one step, side by side."""
    return np.concatenate([to_rgb(arrays[k][0]) for k in spec.images], 1)


@torch.no_grad()
def record_episodes(agent, env_id: str, episodes: int = 1, max_episode_steps: int | None = None,
                    explore: bool = False, seed: int = 10_000, max_steps: int = 10_000,
                    paths: Sequence[str | Path] | None = None, fps: float = 30.0,
                    downsample: int = 1, env_kwargs: dict | None = None) -> list[Recording]:
    """Run `episodes` episodes of one env with the agent's greedy (or sampled) policy and keep
    a frame of every step: `env.render()` for vector observations, the image observations
    themselves otherwise. `max_steps` caps an episode (its return is then partial; the next
    episode starts from a fresh env seeded `seed + i`).

    The episodes are `runner.run_episodes`' (the loop evaluation uses), so the same seeds
    and torch seed give the same episodes with and without video. With `paths` (one video
    file per episode) the frames are streamed to those files instead of being kept in memory
    (`Recording.frames` is then None). `downsample` keeps every k-th pixel of rendered
    frames."""
    from .envs import env_fn
    from .runner import run_episodes
    if paths is not None and len(paths) != episodes:
        raise ValueError(f"{episodes} episodes need {episodes} paths, got {len(paths)}")
    spec = agent.obs_spec
    use_images = bool(spec.images)
    k = max(1, int(downsample))
    make = env_fn(env_id, max_episode_steps, render_mode=None if use_images else "rgb_array",
                  **(env_kwargs or {}))

    def frame(col) -> np.ndarray:
        if use_images:
            return _obs_frame(col.obs, spec)
        drawn = col.envs.envs[0].render()
        if np.ndim(drawn) not in (2, 3):  # None: numpy's "not subscriptable" otherwise
            raise TypeError(f"render() returned {None if drawn is None else np.shape(drawn)}, "
                            f"not an H x W (x C) frame")
        return to_rgb(drawn[::k, ::k])

    frames: list[list[np.ndarray]] = [[] for _ in range(episodes)]
    writers: list[VideoWriter] = []

    def watch(i: int, col) -> None:
        if paths is None:
            frames[i].append(frame(col))
            return
        if len(writers) == i:  # episode i begins: the last one's file is complete
            if writers:
                writers[-1].close()
            writers.append(VideoWriter(paths[i], fps))
        writers[i].append(frame(col))

    try:
        eps = run_episodes(agent, make, spec, agent.act_spec, episodes, explore, seed,
                           max_steps=max_steps, after_cut="fresh", watch=watch)
    finally:  # an error still leaves the frames written so far playable
        if writers and writers[-1].count:
            writers[-1].close()
    return [Recording(np.stack(frames[i]) if paths is None else None, ep.ret, ep.length,
                      Path(paths[i]) if paths is not None else None)
            for i, ep in enumerate(eps)]


# --------------------------------------------------------------------------- open loop


@dataclass
class OpenLoop:
    """Result of `open_loop`: per observation key, truth and prediction over the window
    (B, context + horizon, ...) in observation space (uint8 images, real-valued vectors)."""

    context: int
    horizon: int
    truth: dict[str, np.ndarray]
    pred: dict[str, np.ndarray]
    images: list[str] = field(default_factory=list)
    vectors: list[str] = field(default_factory=list)

    @property
    def length(self) -> int:
        return self.context + self.horizon

    def error(self, key: str) -> np.ndarray:
        t, p = self.truth[key], self.pred[key]
        if key in self.images:
            return np.abs(t.astype(np.int16) - p.astype(np.int16)).astype(np.uint8)
        return np.abs(t - p)

    def frames(self, renderer: StateRenderer | None = None, key: str | None = None,
               rows: int | None = None, labels: bool = True, scale: int | None = None
               ) -> np.ndarray:
        """Video frames (T, H', W', 3): for every batch row (stacked downwards) the panels
        truth | prediction | error, with a bar under the row: green while the model observes,
        red while it dreams; above them (`labels`) a strip naming the columns and the phase.
        Image keys are used directly, scaled up `scale` times (default: to at least PANEL_MIN
        pixels a side; every pixel kept); vector observations need a `renderer`
        (StateRenderer) that draws them."""
        if key is None:
            key = self.images[0] if self.images else (self.vectors[0] if self.vectors else None)
        if key in self.images:
            truth, pred = self.truth[key], self.pred[key]
            truth = np.stack([[to_rgb(f) for f in row] for row in truth])
            pred = np.stack([[to_rgb(f) for f in row] for row in pred])
            scale = scale or max(1, math.ceil(PANEL_MIN / min(truth.shape[2:4])))
        else:
            if renderer is None:
                raise ValueError("vector observations need a StateRenderer to become frames "
                                 "(or plot them with lucid.video.plot_open_loop)")
            truth = renderer.render_many(self.truth[key])
            pred = renderer.render_many(self.pred[key])
        if scale and scale > 1:
            truth, pred = (x.repeat(scale, axis=2).repeat(scale, axis=3) for x in (truth, pred))
        err = np.abs(truth.astype(np.int16) - pred.astype(np.int16)).astype(np.uint8)
        B, T, H, W, _ = truth.shape
        rows = min(rows or B, B)
        out = np.zeros((T, rows * (H + BAR), 3 * W, 3), np.uint8)
        for b in range(rows):
            y = b * (H + BAR)
            out[:, y:y + H, :W] = truth[b]
            out[:, y:y + H, W:2 * W] = pred[b]
            out[:, y:y + H, 2 * W:] = err[b]
            out[:self.context, y + H:y + H + BAR] = CONTEXT_COLOR
            out[self.context:, y + H:y + H + BAR] = DREAM_COLOR
        if not labels:
            return out
        strips = np.stack([_label_strip(W, dreaming=t >= self.context) for t in range(T)])
        return np.concatenate([strips, out], axis=1)


def _label_strip(width: int, dreaming: bool) -> np.ndarray:
    """The LABEL_H-pixel strip above three panels of `width`: "truth", "prediction
    (observing)" in the context bar's green or "prediction (dreaming)" in the dream bar's
    red, "|error|"."""
    from PIL import Image, ImageDraw, ImageFont
    img = Image.new("RGB", (3 * width, LABEL_H), (24, 24, 24))
    draw = ImageDraw.Draw(img)
    try:
        font = ImageFont.load_default(size=12)
    except TypeError:  # Pillow before 10.1: the fixed bitmap font
        font = ImageFont.load_default()
    labels = [("truth", (235, 235, 235)),
              ("prediction (dreaming)" if dreaming else "prediction (observing)",
               tuple(min(255, c + 40) for c in (DREAM_COLOR if dreaming else CONTEXT_COLOR))),
              ("|error|", (235, 235, 235))]
    for i, (text, color) in enumerate(labels):
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        x = i * width + max(2, (width - (right - left)) // 2)
        draw.text((x, (LABEL_H - (bottom - top)) // 2 - top), text, fill=color, font=font)
    return np.asarray(img)


@torch.no_grad()
def open_loop(agent, batch: dict, context: int = 5, horizon: int | None = None,
              sample: bool = False) -> OpenLoop:
    """The world model's open-loop prediction (`WorldModel.dream`: `context` steps filtered,
    then `horizon` steps of the prior driven by the recorded actions) beside the truth, on a
    replayed batch (`to_batch` format, (B, T) windows)."""
    obs = batch["obs"]
    T = batch["is_first"].shape[1]
    if not 1 <= context <= T:
        raise ValueError(f"context must be in [1, {T}], got {context}")
    horizon = T - context if horizon is None else horizon
    if context + horizon > T:
        raise ValueError(f"context {context} + horizon {horizon} exceeds the batch length {T}")
    predicted = agent.dream(obs, batch["action"], batch["is_first"], context, horizon, sample)
    spec = agent.obs_spec
    truth, pred = {}, {}
    for k, p in predicted.items():
        real = obs[k][:, :context + horizon].cpu().numpy()
        pred[k] = p.cpu().numpy()
        truth[k] = real.astype(np.uint8 if k in spec.images else np.float32)
    return OpenLoop(context, horizon, truth, pred, images=list(spec.images),
                    vectors=list(spec.vectors))


PLOT_PANELS = 24  # plot_open_loop's most panels (dimensions) in one figure


def plot_open_loop(result: OpenLoop, path: str | Path, key: str | None = None,
                   row: int = 0) -> Path:
    """A PNG of one batch row's vector observations, every key (or `key`): truth and
    prediction per dimension over time, the dream region shaded (for envs whose states cannot
    be rendered). The first PLOT_PANELS dimensions, in the observation's key order; the
    title says how many are left out."""
    plt = pyplot()
    keys = [key] if key else result.vectors
    panels = [(k, d) for k in keys for d in range(result.truth[k].shape[-1])]
    shown = panels[:PLOT_PANELS]
    fig, axes = plt.subplots(len(shown), 1, figsize=(6, 1.6 * len(shown) + 0.5), sharex=True,
                             squeeze=False)
    for (k, d), ax in zip(shown, axes[:, 0]):
        ax.plot(result.truth[k][row, :, d], "k-", label="truth")
        ax.plot(result.pred[k][row, :, d], "C3--", label="model")
        ax.axvspan(result.context - 0.5, result.length - 0.5, color="C3", alpha=0.08)
        ax.set_ylabel(f"{k}[{d}]")
    axes[0, 0].legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("step (shaded: dream)")
    if len(panels) > len(shown):
        axes[0, 0].set_title(f"the first {len(shown)} of {len(panels)} dimensions "
                             f"(lucid.video.plot_open_loop(..., key=K) for one key)", fontsize=8)
    return save_figure(fig, path, dpi=80)


# --------------------------------------------------------------------------- replay windows


def dream_batch(replay, n: int, length: int, device="cpu", seed: int = 0) -> dict:
    """`n` windows of `length` steps from a Replay, preferring windows in which no new episode
    starts after the first step (so the dream is compared with one continuous episode)."""
    from .replay import to_batch
    stored = replay.stored
    if stored < length:
        raise ValueError(f"the replay holds {stored} steps per env, fewer than the {length} "
                         f"a dream of this length needs; make --context plus --horizon at "
                         f"most {stored}")
    rng = np.random.default_rng(seed)
    oldest = (replay.pos - stored) % replay.per_env
    first = replay.data["is_first"]
    good = []
    for e in range(replay.num_envs):
        flags = first[e, (oldest + np.arange(stored)) % replay.per_env]
        # windows starting at s are clean when flags[s+1 : s+length] has no True
        csum = np.concatenate([[0], np.cumsum(flags)])
        starts = np.arange(stored - length + 1)
        clean = (csum[starts + length] - csum[starts + 1]) == 0
        good += [(e, s) for s in starts[clean]]
    if not good:  # every window crosses an episode start: take any
        good = [(e, s) for e in range(replay.num_envs) for s in range(stored - length + 1)]
    pick = rng.choice(len(good), size=n, replace=len(good) < n)
    env = np.array([good[i][0] for i in pick])[:, None]
    idx = (oldest + np.array([good[i][1] for i in pick])[:, None] + np.arange(length)[None]) \
        % replay.per_env
    return to_batch({k: arr[env, idx] for k, arr in replay.data.items()}, torch.device(device))


def dream(trainer, horizon: int = 45, context: int = 5, rows: int = 3, seed: int = 0
          ) -> OpenLoop:
    """The open-loop dream of a Trainer (its agent and replay) from `rows` replayed windows."""
    batch = dream_batch(trainer.replay, rows, context + horizon, trainer.device, seed)
    return open_loop(trainer.agent, batch, context, horizon)


def dream_frames(trainer, result: OpenLoop, downsample: int = 2) -> np.ndarray | None:
    """Frames of a dream: image panels, or rendered states for vector observations of the
    classic-control envs; None for vector envs whose states cannot be drawn (plot those with
    `plot_open_loop`)."""
    if result.images:
        return result.frames()
    env = trainer.cfg.env
    try:
        renderer = StateRenderer(env.id, env.max_episode_steps, downsample=downsample)
    except Exception:  # not a classic-control env, no render_mode, ...: cannot draw states
        return None
    try:
        return result.frames(renderer)
    finally:
        renderer.close()


def dream_video(trainer, horizon: int = 45, context: int = 5, rows: int = 3, seed: int = 0
                ) -> np.ndarray:
    """Open-loop frames for a Trainer: rendered states for vector observations of
    classic-control envs, image panels otherwise (ValueError for other vector envs)."""
    frames = dream_frames(trainer, dream(trainer, horizon, context, rows, seed))
    if frames is None:
        raise ValueError(f"cannot draw the states of {trainer.cfg.env.id}: states can be drawn "
                         f"for {', '.join(sorted(STATE_FROM_OBS))}; plot its dream with "
                         f"lucid.video.plot_open_loop(lucid.video.dream(trainer), 'dream.png')")
    return frames


def log_videos(trainer, writer, step: int, horizon: int = 45, context: int = 5,
               fps: float = 15.0, rows: int = 3) -> dict[str, Path]:
    """Periodic logging for the training loop: one greedy evaluation episode and one
    open-loop dream, saved to RUN_DIR/videos/ and added to TensorBoard (when `writer` is not
    None). Envs that cannot draw states skip the dream video (a PNG plot is saved instead).
    Returns the written paths. The global torch RNG is restored afterwards, so calling this
    does not change the training run's random stream."""
    dev = torch.device(trainer.device)
    devices = [dev.index or 0] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        return _log_videos(trainer, writer, step, horizon, context, fps, rows)


def _log_videos(trainer, writer, step, horizon, context, fps, rows) -> dict[str, Path]:
    cfg = trainer.cfg
    out_dir = Path(trainer.run_dir) / "videos"
    paths: dict[str, Path] = {}
    try:
        rec = record_episodes(trainer.agent, cfg.env.id, 1, cfg.env.max_episode_steps,
                              env_kwargs=dict(cfg.env.kwargs), seed=video_seed(cfg.run.seed, step),
                              max_steps=1000, downsample=2)[0]
    except Exception as exc:  # noqa: BLE001 - e.g. an env that draws nothing: the dream comes
        warn(f"no evaluation video at {step} env steps ({type(exc).__name__}: {exc}); "
             f"the dream is still made")
    else:
        paths["eval"] = write_video(out_dir / f"eval-{step:09d}.mp4", rec.frames, fps=30)
        if writer is not None:
            log_video(writer, "eval/video", rec.frames, step, fps=fps)
    stored = trainer.replay.stored
    if stored >= context + 1:
        horizon = min(horizon, stored - context)
        result = dream(trainer, horizon, context, rows, seed=step)
        frames = dream_frames(trainer, result)
        if frames is not None:
            paths["dream"] = write_video(out_dir / f"dream-{step:09d}.mp4", frames, fps=fps)
            if writer is not None:
                log_video(writer, "world_model/open_loop", frames, step, fps=fps)
        else:
            paths["dream"] = plot_open_loop(result, out_dir / f"dream-{step:09d}.png")
    return paths


_STEP = re.compile(r"(eval|dream)-(\d{9,})(?=[-.])")  # the names videos get: eval-000012000.mp4


def video_step(path: str | Path) -> int | None:
    """The env step in the name of a video lucid made (`eval-<step>...`, `dream-<step>...`)."""
    m = _STEP.match(Path(path).name)
    return int(m.group(2)) if m else None


def set_aside_videos_after(run_dir: str | Path, env_steps: int) -> list[Path]:
    """Move the videos of steps past `env_steps` (those a killed run made after the
    checkpoint it resumes from) to RUN_DIR/videos/superseded/, out of the report, as the
    logs' rows past it are dropped. Returns their new paths."""
    videos = Path(run_dir) / "videos"
    late = [v for v in (videos.iterdir() if videos.is_dir() else ())
            if v.is_file() and (video_step(v) or 0) > env_steps]
    if not late:
        return []
    (videos / "superseded").mkdir(exist_ok=True)
    moved = []
    for v in late:  # never over one set aside by an earlier resume
        to, n = videos / "superseded" / v.name, 1
        while to.exists():
            to, n = videos / "superseded" / f"{v.stem}.{n}{v.suffix}", n + 1
        moved.append(v.rename(to))
    return moved
