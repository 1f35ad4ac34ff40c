"""`warn(message)`: a UserWarning attributed to the first caller outside lucid, the user's
line, as Python 3.12's `warnings.warn(skip_file_prefixes=...)` does: the location shown and
the one `warnings` filters match are the script's, not lucid's internals."""

import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(message: str) -> None:
    frame, level = sys._getframe(1), 2  # stacklevel 2: warn's caller
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, UserWarning, stacklevel=level - 1 if frame is None else level)
