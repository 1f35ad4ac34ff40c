"""Test-session settings, and each test file's seconds for tests/shards.py when it asks for
them (LUCID_TEST_DURATIONS: a JSON file to write at the end of the session)."""

import json
import os
from collections import defaultdict

import pytest


def offline_wandb_vars(folder) -> dict:
    """Environment variables that keep W&B offline, quiet and inside `folder` (no account,
    nothing written to the home directory)."""
    return {"WANDB_MODE": "offline", "WANDB_SILENT": "true",
            "WANDB_CONFIG_DIR": str(folder / "wandb-config"),
            "WANDB_CACHE_DIR": str(folder / "wandb-cache"),
            "WANDB_DATA_DIR": str(folder / "wandb-data")}


_seconds: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report):
    _seconds[report.nodeid.split("::")[0].rsplit("/", 1)[-1]] += report.duration


def pytest_sessionfinish(session):
    if os.environ.get("LUCID_TEST_DURATIONS"):
        with open(os.environ["LUCID_TEST_DURATIONS"], "w") as f:
            json.dump({k: round(v, 1) for k, v in _seconds.items()}, f)


@pytest.fixture
def offline_wandb(monkeypatch, tmp_path_factory):
    """W&B offline for one test, its own folders outside the test's tmp_path."""
    for k, v in offline_wandb_vars(tmp_path_factory.mktemp("wandb")).items():
        monkeypatch.setenv(k, v)


@pytest.fixture
def said():
    """`said()`: the LucidNotes issued since the last call, one `note: ...` line each (as
    `lucid` commands print them); every note is recorded, also one said before."""
    import warnings
    from lucid.warn import LucidNote
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")

        def take() -> str:
            text = "\n".join(f"note: {w.message}" for w in log
                             if issubclass(w.category, LucidNote))
            log.clear()
            return text
        yield take
