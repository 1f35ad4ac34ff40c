"""lucid's floors: the import-linter layers contract in pyproject.toml holds for the package,
imports inside functions included, and it fails on an upward import (checked on a copy of the
package with one added)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _lint(root: Path) -> subprocess.CompletedProcess:
    """lint-imports with the repo's contract over the `lucid` package found in `root`."""
    return subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache",
                           "--config", str(REPO / "pyproject.toml")],
                          cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300)


def test_imports_only_go_down():
    out = _lint(REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 kept, 0 broken" in out.stdout, out.stdout


def test_an_upward_import_inside_a_function_breaks_the_contract(tmp_path):
    shutil.copytree(REPO / "lucid", tmp_path / "lucid",
                    ignore=shutil.ignore_patterns("__pycache__", "scores"))
    nets = tmp_path / "lucid" / "nets.py"
    nets.write_text(nets.read_text() + "\n\ndef _up():\n    from .train import Trainer\n"
                    "    return Trainer\n")
    out = _lint(tmp_path)
    assert out.returncode != 0, out.stdout
    assert "lucid.nets is not allowed to import lucid.train" in out.stdout, out.stdout
