"""Child processes for tests, each in a process group of its own that is killed whole when it
overruns. `subprocess.run(..., timeout=T)` kills only the child it started, then waits without
a limit for the output pipes to close: torchrun's ranks, Ray's daemons and Chromium's helpers
hold them open, so a hung launcher there would hang the test suite instead of failing a test."""

import os
import signal
import subprocess


def run_grouped(cmd, timeout: float, **kw) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)`, except
    that past `timeout` every process of the group is killed before TimeoutExpired is raised
    (with what was printed until then); what is left of the group when the command ends, or
    when anything else interrupts the wait, is killed too."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **kw) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)  # (Ctrl-C, pytest-timeout and a clean exit: `finally` below)
            try:
                out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:  # a daemon that left the group holds a pipe
                out = err = ""
            raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
        finally:  # also after a clean exit: a daemon that let go of the pipes may be left
            kill_group(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def popen_grouped(cmd, **kw) -> subprocess.Popen:
    """`subprocess.Popen(cmd, **kw)` in a process group of its own, for `kill_group`."""
    return subprocess.Popen(cmd, start_new_session=True, **kw)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL every process in `proc`'s group (started by `run_grouped` or `popen_grouped`)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
