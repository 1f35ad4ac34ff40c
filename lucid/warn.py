"""lucid's warnings: `warn(message)` issues a `LucidWarning` attributed to the first caller
outside lucid, the user's line (as Python 3.12's `warnings.warn(skip_file_prefixes=...)`
does), and each message is shown once per process, wherever it comes from. Filter them by
their category, e.g. `warnings.filterwarnings("ignore", category=LucidWarning)`; a filter of
the user's takes precedence over the once-only default. `lucid` commands print them as
`warning: ...` lines (`show_plainly`)."""

import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


class LucidWarning(UserWarning):
    """A warning from lucid (a questionable env, a failed video or evaluation, ...)."""


warnings.filterwarnings("once", category=LucidWarning, append=True)


def warn(message: str) -> None:
    frame, level = sys._getframe(1), 2  # stacklevel 2: warn's caller
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, LucidWarning, stacklevel=level - 1 if frame is None else level)


def show_plainly(echo) -> None:
    """Print LucidWarnings as `echo("warning: ...")` (for the command line, where the caller's
    line is the CLI library's); other warnings as Python shows them."""
    plain = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, LucidWarning):
            echo(f"warning: {message}")
        else:
            plain(message, category, filename, lineno, file, line)
    warnings.showwarning = show


def raised_at(exc: BaseException) -> str | None:
    """file:line in function of the innermost frame of `exc` in the user's code (not lucid,
    not an installed package or the standard library), unless lucid raised it itself: where
    to look when an env or a callback of the user's fails."""
    import traceback
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames or os.path.abspath(frames[-1].filename).startswith(_PACKAGE):
        return None  # lucid's own message names the problem
    installed = tuple(os.path.abspath(p) + os.sep
                      for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
    for frame in reversed(frames):
        path = os.path.abspath(frame.filename)
        if not path.startswith((_PACKAGE, *installed)) and not frame.filename.startswith("<"):
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return None
