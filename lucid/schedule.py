"""When things fall due in a run: updates at the train ratio (as the authors' `when.Ratio`),
and every-N-env-steps events (evaluations, videos)."""

from __future__ import annotations

import math


class Ratio:
    """Updates that env steps call for: `train_ratio` replayed steps per env step after
    `prefill`, an update replaying `replayed_per_update` steps (B·T on every data-parallel
    rank, whose env steps are all counted). `offset`: updates carried over from before a
    resume that changed the schedule."""

    KEYS = ("train_ratio", "prefill", "replayed_per_update")

    def __init__(self, train_ratio: float, prefill: int, replayed_per_update: int,
                 offset: int = 0):
        self.train_ratio, self.prefill = train_ratio, prefill
        self.replayed_per_update, self.offset = replayed_per_update, offset

    def due(self, env_steps: int) -> int:
        since = env_steps - self.prefill
        if since <= 0:
            return 0
        return math.floor(since * self.train_ratio / self.replayed_per_update) + self.offset

    def state_dict(self) -> dict:
        return {"train_ratio": self.train_ratio, "prefill": self.prefill,
                "replayed_per_update": self.replayed_per_update, "offset": self.offset}

    def resume(self, saved: dict | None, updates: int, env_steps: int) -> dict | None:
        """Go on from a checkpoint's schedule `saved` at `updates` done. A changed ratio,
        prefill, batch or number of learners continues at the new ratio from the updates
        done, not as if the whole run had had it (a burst of updates without new data, or
        none for long). Returns the schedule before, when it changed."""
        self.offset = saved["offset"] if saved else 0
        if saved is None:
            return None
        now = self.state_dict()
        was = {**now, **saved}  # older checkpoints lack the prefill: unchanged
        if all(was[k] == now[k] for k in self.KEYS):
            return None
        self.offset = 0
        self.offset = updates - self.due(env_steps)
        return was


class Every:
    """Due every `every` env steps (0 or None: never), first at the next multiple of
    `every` past `start`."""

    def __init__(self, every: int | None, start: int):
        self.every = every
        self.next = (start // every + 1) * every if every else None

    def __call__(self, env_steps: int) -> bool:
        if self.next is None or env_steps < self.next:
            return False
        self.next += self.every
        return True
