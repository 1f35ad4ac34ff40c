"""Test-session settings. `make test TEST_WORKERS=2` runs the suite in two pytest-xdist
workers, a test file per worker at a time (`--dist loadfile`): each worker, and every process
its tests start, then uses one thread, so that two workers do not oversubscribe a 2-core
machine (OpenMP threads that outnumber the cores spin and wait on each other). Tests that need
a thread count set it themselves."""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")  # before torch is imported
