"""Per-step latency of an exported policy (onnxruntime, CPU) against `Dreamer.predict`, for 1
and 16 envs at once, on CartPole-v1 (vector) and a 64x64 image env.

    python benchmarks/export_latency.py [--steps 300] [--threads 1] [--out results/export_latency.json]

Each figure is the median over `--steps` calls after 20 warm-up calls; torch and
onnxruntime get the same number of threads. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]  # examples.custom_env


def _median_ms(fn, steps: int) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main() -> None:
    import onnxruntime as ort
    from lucid import Dreamer
    from lucid.export import export_onnx
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" /
                                         "export_latency.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for env_id, size in (("CartPole-v1", "mini"), ("examples.custom_env:MyEnv", "mini")):
        agent = Dreamer(env_id, size=size, run__device="cpu", run__threads=args.threads)
        run = agent.trainer
        with tempfile.TemporaryDirectory() as tmp:
            path = export_onnx(agent.agent, run.obs_spec, run.act_spec, Path(tmp) / "p.onnx")
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = opts.inter_op_num_threads = args.threads
            sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        wm = agent.agent.wm
        for n in (1, 16):
            obs = {k: np.zeros((n, *run.obs_spec.shape(k)), run.obs_spec.dtypes[k])
                   for k in run.obs_spec.keys()}
            batch = obs if run.obs_spec.structured else next(iter(obs.values()))
            state = {"s": None}

            def lucid_step():
                _, state["s"] = agent.predict(batch, state["s"], deterministic=True)

            feeds = dict(zip(names, [obs[k] for k in run.obs_spec.keys()] + [
                np.zeros((n, wm.initial_h.shape[0]), np.float32),
                np.zeros((n, wm.G, wm.K), np.float32), np.zeros((n, wm.action_dim), np.float32),
                np.zeros((n,), bool), np.random.default_rng(0).random((n, wm.G, 1),
                                                                      dtype=np.float32)]))
            row = {"env": env_id, "size": size, "envs": n,
                   "predict_ms": _median_ms(lucid_step, args.steps),
                   "onnx_ms": _median_ms(lambda: sess.run(None, feeds), args.steps)}
            rows.append(row)
            print(f"{env_id:28s} {size:5s} {n:3d} envs: predict {row['predict_ms']:6.3f} ms, "
                  f"onnxruntime {row['onnx_ms']:6.3f} ms "
                  f"({row['predict_ms'] / row['onnx_ms']:.1f}x)", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"threads": args.threads, "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
