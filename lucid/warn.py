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


class LucidNote(LucidWarning):
    """Something to know about a run that is no fault: a setting that trains slowly, a run
    that will make no update, a device that the machine lacks. `lucid` commands print them
    as `note: ...` lines."""


warnings.filterwarnings("once", category=LucidWarning, append=True)


def warn(message: str, category: type[LucidWarning] = LucidWarning) -> None:
    frame, level = sys._getframe(1), 2  # stacklevel 2: warn's caller
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level - 1 if frame is None else level)


def note(message: str) -> None:
    """A `LucidNote`: the warnings path, so that a program can filter or log it."""
    warn(message, LucidNote)


def show_plainly(echo, echo_note=None) -> None:
    """Print LucidWarnings as `echo("warning: ...")` and LucidNotes as `echo_note("note: ...")`
    (default: `echo`), for the command line, where the caller's line is the CLI library's;
    other warnings as Python shows them."""
    plain = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, LucidNote):
            (echo_note or echo)(f"note: {message}")
        elif issubclass(category, LucidWarning):
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
