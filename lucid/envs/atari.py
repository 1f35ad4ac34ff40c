"""Atari through ale-py, with the 2023 DreamerV3 paper's settings.

`atari:Pong` (Atari 200M protocol): 64x64 RGB, action repeat 4 with a max-pool over the last
two frames, sticky actions 0.25 (per emulator frame, Machado et al. 2018), the full action set
of 18, no life-loss signal, episodes truncated at 108,000 emulator frames.
`atari100k:Pong`: the same without sticky actions, with 0-29 random no-ops at reset (the
authors' `randint(30)`) and the game's minimal action set.

The stack is ale-py's gymnasium env (frameskip 1, for reset, seeding, spaces and rendering)
-> our subclass of gymnasium's AtariPreprocessing (resize with cv2 INTER_AREA, grayscale
option), whose reset draws the no-ops and whose step drives the emulator itself: per
emulator frame the sticky-action draw and `ale.act`, the screen grabbed for the max-pool of
the last two frames, and an episode's last observation is its final screen.
"""

from __future__ import annotations

import difflib

import gymnasium as gym

from .extras import require

ATARI_DEFAULTS = dict(size=64, repeat=4, sticky=0.25, gray=False, noops=0, full_action_space=True,
                      max_frames=108_000, life_loss=False)
ATARI100K_DEFAULTS = dict(ATARI_DEFAULTS, sticky=0.0, noops=30, full_action_space=False)


def game_id(game: str) -> str:
    """`Pong`, `pong`, `space_invaders`, `ALE/Pong-v5` -> the ALE v5 gymnasium id."""
    if game.startswith("ALE/"):
        return game
    if "_" in game or game.islower():
        game = "".join(part[:1].upper() + part[1:] for part in game.split("_"))
    return f"ALE/{game}-v5"


def _register():
    ale_py = require("ale_py", "atari", "atari")
    require("cv2", "atari", "atari")
    gym.register_envs(ale_py)


def make_raw(game: str, full_action_space: bool = True,
             max_frames: int = 108_000, gray: bool = False, render_mode: str | None = None
             ) -> gym.Env:
    """The bare ALE env, one emulator frame per step, with the ALE's own sticky actions off:
    `AtariPreprocessing` draws them per emulator frame, so the executed actions can be
    observed."""
    _register()
    gid = game_id(game)
    if gid not in gym.registry:
        games = sorted(k[4:-3] for k in gym.registry if k.startswith("ALE/") and k.endswith("-v5"))
        close = difflib.get_close_matches(gid[4:-3], games, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown Atari game {game!r}{hint}")
    kwargs = dict(frameskip=1, repeat_action_probability=0.0, full_action_space=full_action_space,
                  max_num_frames_per_episode=max_frames, obs_type="grayscale" if gray else "rgb")
    if render_mode:
        kwargs["render_mode"] = render_mode
    return gym.make(gid, **kwargs)


class AtariPreprocessing(gym.wrappers.AtariPreprocessing):
    """gymnasium's AtariPreprocessing with sticky actions, whose step drives the ALE directly.

    * Sticky actions (Machado et al. 2018): on every emulator frame, with probability
      `sticky`, the previously executed action is repeated instead of the agent's (drawn
      from the env's seeded `np_random`; the previous action is NOOP after a reset), as the
      ALE's own repeat_action_probability does.
    * The observation returned when an episode ends during the frame repeat shows the final
      screen (gymnasium's stops before grabbing it, so every episode's last observation
      would repeat the previous one).
    * No-ops at reset: 0 to `noops` - 1 emulator frames of NOOP, drawn uniformly from the
      env's seeded `np_random`, as the authors' `randint(noops)`; gymnasium's `noop_max`
      draws 1 to noop_max, so it is kept at 0 here.
    * Each emulator frame is one `ale.act` (what ale-py's env step does with frameskip 1,
      without its per-frame observation copy, info dict and wrapper calls); the screens are
      read straight into this wrapper's buffers. Resets and their no-ops still go through
      ale-py's env, and `env.render()` reads the ALE's screen."""

    def __init__(self, env: gym.Env, sticky: float = 0.0, noops: int = 0, **kwargs):
        if kwargs.get("noop_max"):
            raise ValueError("give the no-ops as noops=N (0 to N - 1 drawn at reset), not "
                             "gymnasium's noop_max (1 to N)")
        super().__init__(env, noop_max=0, **kwargs)
        if not 0.0 <= sticky <= 1.0:
            raise ValueError(f"sticky must be a probability in [0, 1], got {sticky}")
        if noops < 0:
            raise ValueError(f"noops must be >= 0, got {noops}")
        self.sticky = float(sticky)
        self.noops = int(noops)
        self.base = env.unwrapped
        self.action_set = self.base._action_set
        if self.noops and self.base.get_action_meanings()[0] != "NOOP":
            raise ValueError("no-ops at reset need the game's action 0 to be NOOP")
        self.last_action = self.action_set[0]  # NOOP

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self.last_action = self.action_set[0]
        _, info = self.env.reset(seed=seed, options=options)
        for _ in range(int(self.base.np_random.integers(self.noops)) if self.noops else 0):
            _, _, terminated, truncated, step_info = self.env.step(0)
            info.update(step_info)
            if terminated or truncated:  # not reseeded: that would replay the same start
                _, info = self.env.reset(options=options)
        self.lives = self.ale.lives()
        self._grab(self.obs_buffer[0])
        self.obs_buffer[1].fill(0)
        return self._get_obs(), info

    def _grab(self, out):
        if self.grayscale_obs:
            self.ale.getScreenGrayscale(out)
        else:
            self.ale.getScreenRGB(out)

    def step(self, action):
        ale, wanted, total = self.ale, self.action_set[action], 0.0
        terminated = truncated = False
        for t in range(self.frame_skip):
            if not (self.sticky and self.np_random.random() < self.sticky):
                self.last_action = wanted
            total += ale.act(self.last_action)
            terminated = ale.game_over(with_truncation=False)
            truncated = ale.game_truncated()
            self.game_over = terminated
            if self.terminal_on_life_loss:
                lives = ale.lives()
                terminated = terminated or lives < self.lives
                self.game_over, self.lives = terminated, lives
            if t == self.frame_skip - 2:
                self._grab(self.obs_buffer[1])
            if terminated or truncated:
                if t < self.frame_skip - 2:  # no second-to-last frame in this step
                    self._grab(self.obs_buffer[1])
                break
        self._grab(self.obs_buffer[0])
        return self._get_obs(), total, terminated, truncated, self.base._get_info()


def wrap(env: gym.Env, size: int = 64, repeat: int = 4, gray: bool = False, noops: int = 0,
         life_loss: bool = False, sticky: float = 0.0) -> gym.Env:
    """Sticky actions, frame repeat with max-pool of the last two frames, resize, no-ops."""
    return AtariPreprocessing(
        env, sticky=sticky, noops=noops, frame_skip=repeat, screen_size=size,
        terminal_on_life_loss=life_loss, grayscale_obs=gray, grayscale_newaxis=True,
        scale_obs=False)


def make_atari(game: str, benchmark: str = "atari", render_mode: str | None = None,
               **overrides) -> gym.Env:
    """`benchmark` is "atari" or "atari100k"; any default can be overridden by keyword:
    size, repeat, sticky, gray, noops, full_action_space, max_frames, life_loss."""
    opts = dict(ATARI100K_DEFAULTS if benchmark == "atari100k" else ATARI_DEFAULTS)
    unknown = set(overrides) - set(opts)
    if unknown:
        raise TypeError(f"unknown Atari option(s) {sorted(unknown)}; options: {sorted(opts)}")
    opts.update(overrides)
    env = make_raw(game, opts["full_action_space"], opts["max_frames"], opts["gray"], render_mode)
    return wrap(env, opts["size"], opts["repeat"], opts["gray"], opts["noops"], opts["life_loss"],
                opts["sticky"])
