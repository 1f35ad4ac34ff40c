"""Virtualenvs for the peer implementations (used by benchmarks/peers.py).

Each peer gets its own virtualenv under benchmarks/.peers/<name>/ (gitignored). torch is
installed first, pinned to the version this interpreter runs (so pip never swaps in a
multi-GB CUDA build), and a constraints file keeps it pinned while the peer installs.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent / ".peers"
PEERS = {
    "rllib": ["ray[rllib]==2.60.0", "pillow"],  # its DreamerV3 imports PIL (not declared)
    "sheeprl": ["sheeprl==0.8.4"],
}


def torch_pin() -> str:
    return "torch==" + torch.__version__.split("+")[0]


def python_of(name: str) -> Path:
    return ROOT / name / "bin" / "python"


def ensure(name: str, log=print) -> tuple[bool, str]:
    """Create benchmarks/.peers/<name> with torch pinned and the peer installed. Returns
    (ok, message); the pip log is in benchmarks/.peers/<name>.log."""
    env_dir = ROOT / name
    marker = env_dir / ".installed"
    if marker.exists():
        return True, marker.read_text().strip()
    ROOT.mkdir(parents=True, exist_ok=True)
    constraints = ROOT / "constraints.txt"
    constraints.write_text(torch_pin() + "\n")
    logfile = ROOT / f"{name}.log"
    if not python_of(name).exists():
        venv.create(env_dir, with_pip=True)
    py = str(python_of(name))
    steps = [[py, "-m", "pip", "install", torch_pin()],
             [py, "-m", "pip", "install", "-c", str(constraints), *PEERS[name]]]
    with open(logfile, "a") as out:
        for cmd in steps:
            log(f"[{name}] {' '.join(cmd[2:])}  (log: {logfile})")
            rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT)
            if rc != 0:
                tail = logfile.read_text().splitlines()[-15:]
                return False, (f"`{' '.join(cmd[2:])}` failed (exit {rc}); last lines of "
                               f"{logfile}:\n  " + "\n  ".join(tail))
    got = subprocess.run([py, "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True).stdout.strip()
    if got.split("+")[0] != torch_pin().split("==")[1]:
        return False, f"the {name} virtualenv ended up with torch {got}, not {torch_pin()}"
    marker.write_text(f"{' '.join(PEERS[name])} with torch {got}\n")
    return True, marker.read_text().strip()


if __name__ == "__main__":
    for n in sys.argv[1:] or list(PEERS):
        print(n, ensure(n))
