"""Environment steps per second per suite: through lucid's wrappers (`make_env`) against the
raw environment doing the same work by hand, so the difference is our overhead.

    python benchmarks/envs.py                                # all installed suites, 2 s x 7
    python benchmarks/envs.py --suites atari:Pong crafter --seconds 0.5 --repeats 3
    taskset -c 1 env OMP_NUM_THREADS=1 python benchmarks/envs.py   # final numbers, quiet machine

For every suite, `ours` and `raw` step the same seeded sequence of random actions in one
process. In each repeat they take turns in blocks of ~20 ms of stepping (alternating which
goes first) until each has stepped for `--seconds`, so both see the same load on the core;
resets are done outside the timed blocks (Crafter's world generation alone takes ~1 s), and
env construction is not timed. Reported: agent steps per wall-clock second and per second of
this process's CPU time (the latter is less disturbed by other load on the core), medians
over the repeats, and the overhead raw/ours - 1 (extra time per step), the median of the
per-repeat ratios. The raw baselines:

    atari:Pong      ale_py.ALEInterface, sticky actions 0.25 inside the ALE, 4 frames per step,
                    max of the last two RGB screens, cv2 INTER_AREA resize to 64x64, full
                    action set, 108,000-frame limit
    atari100k:Pong  the same without sticky actions, minimal action set, 1-30 no-ops at reset
    dmc:*           dm_control.suite.load, the action applied twice, the observation dict
                    concatenated into one float32 vector
    dmc-vision:*    the same plus physics.render(64, 64, camera_id=0) once per agent step
                    (`fast_render`: shadow map 256^2 and no multisampling on both sides)
    crafter         crafter.Env (old gym API), 64x64
    minigrid:*      the bare MiniGridEnv, get_frame(tile_size=16) and a cv2 INTER_AREA
                    resize to 64x64
    CartPole-v1     gymnasium's CartPoleEnv class with the 500-step limit counted by hand
                    (ours is gym.make's stack: TimeLimit, OrderEnforcing, PassiveEnvChecker)
    custom          examples.custom_env:MyEnv against the same class built directly: the
                    same object, so its "overhead" is the measurement's noise floor

memory-maze and envpool are reported as not installed when they are not. Output: a table on
stdout and benchmarks/results/envs.json (machine, load average before and after, settings,
per-repeat numbers).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")  # before anything imports mujoco
if os.environ["MUJOCO_GL"] in ("egl", "osmesa"):
    os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import machine, write_json  # noqa: E402

from lucid.envs import MissingExtraError, make_env  # noqa: E402

SEED = 0


# --------------------------------------------------------------------------- steppers
# A stepper is an object with reset() and step(action) -> episode ended (bool). Raw steppers
# get the same actions as ours, unconverted, unless they define prepare(actions) (done once).

class Gym:
    """A gymnasium env (ours: whatever make_env returns)."""

    def __init__(self, env):
        self.env, self.seed = env, SEED

    def reset(self):
        self.env.reset(seed=self.seed)
        self.seed += 1

    def step(self, action) -> bool:
        _, _, terminated, truncated, _ = self.env.step(action)
        return terminated or truncated

    def close(self):
        self.env.close()


class RawAtari:
    """The paper's Atari preprocessing done by hand on the bare ALE."""

    def __init__(self, game="pong", sticky=0.25, full_action_space=True, noops=0, size=64,
                 repeat=4, max_frames=108_000):
        import cv2
        from ale_py import ALEInterface, LoggerMode, roms
        ALEInterface.setLoggerMode(LoggerMode.Error)
        self.cv2, self.size, self.repeat, self.noops = cv2, size, repeat, noops
        self.ale = ale = ALEInterface()
        ale.setInt("random_seed", SEED)
        ale.setFloat("repeat_action_probability", sticky)
        ale.setInt("frame_skip", 1)
        ale.setInt("max_num_frames_per_episode", max_frames)
        ale.loadROM(roms.get_rom_path(game))
        self.actions = ale.getLegalActionSet() if full_action_space else ale.getMinimalActionSet()
        h, w = ale.getScreenDims()
        self.buf = [np.zeros((h, w, 3), np.uint8), np.zeros((h, w, 3), np.uint8)]
        self.rng = np.random.default_rng(SEED)

    def _obs(self):
        return self.cv2.resize(self.buf[0], (self.size, self.size),
                               interpolation=self.cv2.INTER_AREA)

    def reset(self):
        self.ale.reset_game()
        if self.noops:
            for _ in range(int(self.rng.integers(1, self.noops + 1))):
                self.ale.act(self.actions[0])
                if self.ale.game_over():
                    self.ale.reset_game()
        self.ale.getScreenRGB(self.buf[0])
        self.buf[1][:] = 0
        return self._obs()

    def step(self, action) -> bool:
        a, total = self.actions[action], 0.0
        for t in range(self.repeat):
            total += self.ale.act(a)
            over = self.ale.game_over()
            if t == self.repeat - 2 or (over and t < self.repeat - 2):
                self.ale.getScreenRGB(self.buf[1])
            if over:
                break
        self.ale.getScreenRGB(self.buf[0])
        np.maximum(self.buf[0], self.buf[1], out=self.buf[0])
        self._obs()
        return over

    def close(self):
        pass


class RawDMC:
    def __init__(self, task="walker-walk", vision=False, repeat=2, size=64, fast_render=False):
        from dm_control import suite
        from lucid.envs.dmc import parse_task
        domain, name = parse_task(task)
        self.env = suite.load(domain, name, task_kwargs={"random": SEED})
        if fast_render:
            q = self.env.physics.model.vis.quality
            q.shadowsize, q.offsamples = 256, 0
        self.vision, self.repeat, self.size = vision, repeat, size
        self.keys = list(self.env.observation_spec())

    @staticmethod
    def prepare(actions):  # dm_control's own dtype, converted once, not per step
        return actions.astype(np.float64)

    def _obs(self, ts):
        if self.vision:
            return self.env.physics.render(self.size, self.size, camera_id=0)
        return np.concatenate([np.asarray(ts.observation[k], np.float32).ravel()
                               for k in self.keys])

    def reset(self):
        return self._obs(self.env.reset())

    def step(self, action) -> bool:
        total = 0.0
        for _ in range(self.repeat):
            ts = self.env.step(action)
            total += ts.reward or 0.0
            if ts.last():
                break
        self._obs(ts)
        return ts.last()

    def close(self):
        self.env.close()


class RawCrafter:
    def __init__(self):
        import crafter
        self.env = crafter.Env(size=(64, 64), seed=SEED)

    def reset(self):
        return self.env.reset()

    def step(self, action) -> bool:
        return self.env.step(action)[2]

    def close(self):
        pass


class RawMiniGrid:
    def __init__(self, task="DoorKey-5x5", tile_size=16, size=64):
        import cv2
        import gymnasium as gym
        import minigrid  # noqa: F401 - registers the ids
        self.env = gym.make(f"MiniGrid-{task}-v0").unwrapped
        self.cv2, self.tile, self.size, self.seed = cv2, tile_size, size, SEED

    def _obs(self):
        frame = self.env.get_frame(highlight=self.env.highlight, tile_size=self.tile)
        return self.cv2.resize(frame, (self.size, self.size), interpolation=self.cv2.INTER_AREA)

    def reset(self):
        self.env.reset(seed=self.seed)
        self.seed += 1
        return self._obs()

    def step(self, action) -> bool:
        _, _, terminated, truncated, _ = self.env.step(action)
        self._obs()
        return terminated or truncated

    def close(self):
        self.env.close()


class RawCartPole:
    def __init__(self, limit=500):
        from gymnasium.envs.classic_control import CartPoleEnv
        self.env, self.limit, self.t, self.seed = CartPoleEnv(), limit, 0, SEED

    def reset(self):
        self.t = 0
        self.env.reset(seed=self.seed)
        self.seed += 1

    def step(self, action) -> bool:
        self.t += 1
        _, _, terminated, _, _ = self.env.step(action)
        return terminated or self.t >= self.limit

    def close(self):
        self.env.close()


class RawMemoryMaze:
    """memory_maze's dm_env task stepped directly (the one our wrapper builds)."""

    def __init__(self, task="9x9", size=64):
        os.environ.setdefault("MUJOCO_GL", "egl")
        from memory_maze import tasks
        self.env = getattr(tasks, f"memory_maze_{task}")(
            image_only_obs=True, discrete_actions=True, camera_resolution=size,
            good_visibility=False, seed=SEED)

    def reset(self):
        return self.env.reset().observation

    def step(self, action) -> bool:
        ts = self.env.step(int(action))
        return ts.last()

    def close(self):
        self.env.close()


class RawEnvpool:
    """envpool's batched gymnasium env (batch of 1) with the settings our wrapper passes."""

    def __init__(self, task="Pong-v5"):
        from lucid.envs.envpool import ATARI_ENVPOOL_DEFAULTS, _load_egl
        _load_egl()
        import envpool
        self.env = envpool.make_gymnasium(task, num_envs=1, batch_size=1, seed=SEED,
                                          **ATARI_ENVPOOL_DEFAULTS)

    @staticmethod
    def prepare(actions):  # batched actions, built once, not per step
        return actions.reshape(-1, 1)

    def reset(self):
        return self.env.reset()

    def step(self, action) -> bool:
        _, _, terminated, truncated, _ = self.env.step(action)
        return bool(terminated[0] or truncated[0])

    def close(self):
        self.env.close()


class RawCustom(Gym):
    def __init__(self):
        sys.path.insert(0, str(ROOT))
        from examples.custom_env import MyEnv
        super().__init__(MyEnv())


# suite name -> (make_env id, make_env options, raw stepper factory, what the raw one is)
SUITES = {
    "atari:Pong": ("atari:Pong", {}, lambda: RawAtari("pong", 0.25, True, 0),
                   "ALEInterface + repeat 4, max-pool, INTER_AREA resize by hand"),
    "atari100k:Pong": ("atari100k:Pong", {}, lambda: RawAtari("pong", 0.0, False, 30),
                       "ALEInterface, no sticky, minimal actions, no-ops, same preprocessing"),
    "dmc:walker-walk": ("dmc:walker-walk", {}, lambda: RawDMC("walker-walk"),
                        "dm_control suite.load, repeat 2, concat obs"),
    "dmc-vision:walker-walk": ("dmc-vision:walker-walk", {},
                               lambda: RawDMC("walker-walk", vision=True),
                               "dm_control, repeat 2, physics.render 64x64"),
    "dmc-vision:walker-walk+fast_render": (
        "dmc-vision:walker-walk", {"fast_render": True},
        lambda: RawDMC("walker-walk", vision=True, fast_render=True),
        "same, shadow map 256^2, no multisampling"),
    "crafter": ("crafter", {}, RawCrafter, "crafter.Env"),
    "minigrid:DoorKey-5x5": ("minigrid:DoorKey-5x5", {}, lambda: RawMiniGrid("DoorKey-5x5"),
                             "MiniGridEnv + get_frame + INTER_AREA resize"),
    "CartPole-v1": ("CartPole-v1", {}, RawCartPole, "CartPoleEnv, limit counted by hand"),
    "custom": ("examples.custom_env:MyEnv", {}, RawCustom,
               "the same class built directly (noise floor)"),
    "memory-maze:9x9": ("memory-maze:9x9", {}, RawMemoryMaze,
                        "memory_maze.tasks dm_env task, same options"),
    "envpool:Pong-v5": ("envpool:Pong-v5", {}, RawEnvpool,
                        "envpool.make_gymnasium, batch of 1, same Atari settings"),
}


# --------------------------------------------------------------------------- timing

def _block(stepper, actions, i: int, block: int, acc: dict) -> int:
    """Time up to `block` steps (fewer if the episode ends; the reset is not timed) into
    `acc`; returns the next action index."""
    n, done, k = len(actions), False, 0
    w0, c0 = time.perf_counter(), time.process_time()
    while k < block and not done:
        done = stepper.step(actions[(i + k) % n])
        k += 1
    acc["wall_s"] += time.perf_counter() - w0
    acc["cpu_s"] += time.process_time() - c0
    acc["steps"] += k
    if done:
        stepper.reset()
    return i + k


def paired(sides: dict, acts: dict, seconds: float, block: dict) -> dict:
    """One repeat: ours and raw take turns in blocks of ~20 ms (alternating which goes
    first) until each has stepped for `seconds`, so both meet the same load on the core."""
    acc = {side: {"steps": 0, "wall_s": 0.0, "cpu_s": 0.0} for side in sides}
    idx = {side: 0 for side in sides}
    names, turn = list(sides), 0
    while min(a["wall_s"] for a in acc.values()) < seconds:
        for side in (names if turn % 2 == 0 else names[::-1]):
            idx[side] = _block(sides[side], acts[side], idx[side], block[side], acc[side])
        turn += 1
    for a in acc.values():
        a["steps_per_s"] = a["steps"] / a["wall_s"]
        a["steps_per_cpu_s"] = a["steps"] / max(a["cpu_s"], 1e-9)
    return acc


def bench_suite(name: str, seconds: float, repeats: int) -> dict:
    env_id, options, raw_fn, raw_desc = SUITES[name]
    try:
        env = make_env(env_id, **options)
    except MissingExtraError as exc:
        return {"suite": name, "installed": False, "error": str(exc).split(" (")[0]}
    space = env.action_space
    space.seed(SEED)
    actions = np.stack([np.asarray(space.sample()) for _ in range(4096)])
    sides = {"ours": Gym(env), "raw": raw_fn()}
    acts = {"ours": actions, "raw": getattr(sides["raw"], "prepare", lambda a: a)(actions)}
    block = {}
    for side, stepper in sides.items():  # warm-up; then blocks of ~20 ms of stepping
        stepper.reset()
        warm = {"steps": 0, "wall_s": 0.0, "cpu_s": 0.0}
        i = 0
        while warm["wall_s"] < min(0.2, seconds):
            i = _block(stepper, acts[side], i, 1, warm)
        block[side] = int(np.clip(warm["steps"] / warm["wall_s"] * 0.02, 1, 1000))
    runs = {"ours": [], "raw": []}
    for _ in range(repeats):
        rep = paired(sides, acts, seconds, block)
        for side in runs:
            runs[side].append(rep[side])
    for stepper in sides.values():
        stepper.close()

    def med(side, key):
        return statistics.median(run[key] for run in runs[side])

    def ratios(key):  # time per step, ours / raw - 1, one per repeat
        return [raw[key] / ours[key] - 1 for ours, raw in zip(runs["ours"], runs["raw"])]

    return {"suite": name, "installed": True, "env_id": env_id, "options": options,
            "raw": raw_desc, "block_steps": block,
            "ours_steps_per_s": med("ours", "steps_per_s"),
            "raw_steps_per_s": med("raw", "steps_per_s"),
            "ours_steps_per_cpu_s": med("ours", "steps_per_cpu_s"),
            "raw_steps_per_cpu_s": med("raw", "steps_per_cpu_s"),
            "overhead_wall": statistics.median(ratios("steps_per_s")),
            "overhead_cpu": statistics.median(ratios("steps_per_cpu_s")),
            "overhead_cpu_range": [min(ratios("steps_per_cpu_s")), max(ratios("steps_per_cpu_s"))],
            "repeats": runs}


def table(results: list[dict]) -> str:
    head = (f"{'suite':38} {'ours/s':>9} {'raw/s':>9} {'ours/cpu-s':>10} {'raw/cpu-s':>10} "
            f"{'overhead cpu':>13} {'(min..max)':>15} {'wall':>7}")
    lines = [head, "-" * len(head)]
    for r in results:
        if not r["installed"]:
            lines.append(f"{r['suite']:38} not installed ({r['error']})")
            continue
        lo, hi = r["overhead_cpu_range"]
        lines.append(
            f"{r['suite']:38} {r['ours_steps_per_s']:9.0f} {r['raw_steps_per_s']:9.0f} "
            f"{r['ours_steps_per_cpu_s']:10.0f} {r['raw_steps_per_cpu_s']:10.0f} "
            f"{100 * r['overhead_cpu']:12.1f}% {f'({100 * lo:.0f}..{100 * hi:.0f}%)':>15} "
            f"{100 * r['overhead_wall']:6.1f}%")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suites", nargs="*", default=list(SUITES), choices=list(SUITES),
                   metavar="SUITE", help=f"any of: {', '.join(SUITES)}")
    p.add_argument("--seconds", type=float, default=2.0, help="stepping time per measurement")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "envs.json"))
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    info = machine()
    results = []
    for name in args.suites:
        t0 = time.time()
        res = bench_suite(name, args.seconds, args.repeats)
        results.append(res)
        if res["installed"]:
            print(f"{name}: ours {res['ours_steps_per_s']:.0f}/s, raw "
                  f"{res['raw_steps_per_s']:.0f}/s, overhead {100 * res['overhead_cpu']:.1f}% "
                  f"(cpu time)  [{time.time() - t0:.0f} s]", flush=True)
        else:
            print(f"{name}: not installed", flush=True)
    print()
    print(table(results))
    load_after = os.getloadavg()
    print(f"\nload average before {load_before}, after {load_after}")
    write_json(args.out, {
        "benchmark": "env steps per second through lucid's wrappers vs the raw env",
        "machine": info, "load_avg_before": load_before, "load_avg_after": load_after,
        "settings": {"seconds": args.seconds, "repeats": args.repeats,
                     "actions": "uniform random, seeded, same sequence for ours and raw",
                     "resets": "not timed", "overhead": "median over repeats of "
                     "raw_rate / ours_rate - 1 (extra time per step)",
                     "command": " ".join([Path(sys.executable).name, *sys.argv])},
        "results": results,
    })
    return results


if __name__ == "__main__":
    main()
