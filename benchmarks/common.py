"""Shared pieces of the benchmark scripts: machine description, library versions, JSON."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import resource
import subprocess
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _version(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "lucid"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "") if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def machine() -> dict:
    """Where and with what the numbers were measured."""
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    mem_gb = None
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        pass
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "affinity": affinity,
        "memory_gb": mem_gb,
        "load_avg": os.getloadavg(),
        "torch_threads": torch.get_num_threads(),
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": _version("numpy"),
            "gymnasium": _version("gymnasium"),
            "lucid": _version("lucid-rl"),
            "lucid_commit": _git_commit(),
            "cuda": torch.version.cuda,
            "mkl": torch.backends.mkl.is_available(),
            "mkldnn": torch.backends.mkldnn.is_available(),
        },
    }


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_anon_mb() -> float:
    """Anonymous (not file-backed) resident memory of this process (MB): what a memory-mapped
    replay does not add to, since its pages belong to the page cache and can be evicted."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def rss_mb() -> float:
    """Current resident memory of this process (MB)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


# The inputs and action spaces of the benchmarks' agents (train_step.spaces builds them).
OBS_KINDS = ("vector", "image")
ACTION_KINDS = ("discrete", "continuous", "mixed")


def agent_shape_args(p, size: str) -> None:
    """--size, --obs, --action, --batch, --length: the one agent and batch a script times
    (train_step.agent_and_batch; ab.py, profile_step.py)."""
    p.add_argument("--size", default=size)
    p.add_argument("--obs", default="vector", choices=OBS_KINDS)
    p.add_argument("--action", default="discrete", choices=ACTION_KINDS)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=64)


def write_json(path: str | Path, payload: dict, quiet: bool = False) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")  # whole or not at all, even if killed mid-write
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    tmp.replace(out)
    if not quiet:
        print(f"wrote {out}")
    return out


def matmul_peak(n: int = 2048, repeats: int = 7, device: str | torch.device = "cpu",
                dtype=torch.float32) -> dict:
    """Achieved GFLOP/s of an n x n x n matrix product (median and best of `repeats`, after
    one warm-up) at the current thread count: the machine's practical arithmetic peak."""
    device = torch.device(device)
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device, dtype)
    b = torch.randn(n, n, generator=g).to(device, dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.mm(a, b)
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    flop = 2.0 * n ** 3
    return {"n": n, "dtype": str(dtype).replace("torch.", ""), "repeats": repeats,
            "threads": torch.get_num_threads(),
            "gflops_median": flop / times[len(times) // 2] / 1e9,
            "gflops_best": flop / times[0] / 1e9}
