"""Test-session settings. `make test TEST_WORKERS=2` runs the suite in two pytest-xdist
workers, a test file per worker at a time (`--dist loadfile`): each worker, and every process
its tests start, then uses one thread, so that two workers do not oversubscribe a 2-core
machine (OpenMP threads that outnumber the cores spin and wait on each other). Tests that need
a thread count set it themselves."""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")  # before torch is imported


import pytest


def offline_wandb_vars(folder) -> dict:
    """Environment variables that keep W&B offline, quiet and inside `folder` (no account,
    nothing written to the home directory)."""
    return {"WANDB_MODE": "offline", "WANDB_SILENT": "true",
            "WANDB_CONFIG_DIR": str(folder / "wandb-config"),
            "WANDB_CACHE_DIR": str(folder / "wandb-cache"),
            "WANDB_DATA_DIR": str(folder / "wandb-data")}


@pytest.fixture
def offline_wandb(monkeypatch, tmp_path_factory):
    """W&B offline for one test, its own folders outside the test's tmp_path."""
    for k, v in offline_wandb_vars(tmp_path_factory.mktemp("wandb")).items():
        monkeypatch.setenv(k, v)
