"""Optional dependencies of the environment suites, and the error a missing one raises."""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtraError(ImportError, ValueError):
    """An environment suite needs an optional package that is not installed. Also a
    ValueError, so callers that report bad env names (the CLI) report this one too."""


def require(module: str, extra: str, suite: str | None = None) -> ModuleType:
    """Import `module`, or raise MissingExtraError naming the pip extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        what = suite or extra
        raise MissingExtraError(
            f"the {what!r} environments need the optional package {module!r}, which is not "
            f"installed ({exc}). Install it with: pip install 'lucid-rl[{extra}]'  "
            f"(from a checkout: pip install -e '.[{extra}]')") from exc
