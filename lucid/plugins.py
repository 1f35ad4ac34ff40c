"""Objects named by the user as text: `module.path:Attr` or `path/to/file.py:Attr` (an env
class or factory, an Agent subclass in `model.agent`). A file is imported once per process
under a name of its own, with its directory on the import path, as `python file.py` would."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path


def file_id(env_id: str) -> tuple[str, str] | None:
    """(path, attribute) of a `path/to/file.py:Attr` id; None for any other id."""
    path, sep, attr = env_id.rpartition(":")
    return (path, attr) if sep and path.endswith(".py") else None


def is_file_id(env_id: str) -> bool:
    """Whether `env_id` names an object by its Python file (`path/to/file.py:Attr`)."""
    return file_id(env_id) is not None


def resolve_id(env_id: str) -> str:
    """A `file.py:Attr` id (of an env, or of model.agent) with the file's path made absolute,
    so that the run resumes, evaluates and records from any directory; any other as it is."""
    found = file_id(env_id)
    if found is None:
        return env_id
    path, attr = found
    return f"{Path(path).expanduser().resolve()}:{attr}"


def import_file(path: str):
    """The module of a Python file, imported once per process under a name of its own; its
    directory joins the import path (as for `python file.py`), for the modules next to it."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ModuleNotFoundError(f"there is no file {file} (if it moved, give its new path; "
                                  f"for a run, in the run's config.yaml: env.id, or "
                                  f"model.agent for an Agent class)")
    stem = re.sub(r"\W", "_", file.stem)  # a module name pickle can import again
    name = f"_lucid_env_{stem}_{hashlib.sha1(str(file).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    folder = str(file.parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    names = [name]
    if file.stem.isidentifier() and file.stem not in sys.modules and _finds(file.stem, file):
        names.append(file.stem)  # `import my_env` in a module next to it: this module, not a
        # second copy with classes of their own (isinstance, class attributes)
    for n in names:
        sys.modules[n] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        for n in names:
            del sys.modules[n]
        if added:
            sys.path.remove(folder)
        raise
    return module


def _finds(top: str, file: Path) -> bool:
    """Whether `import top` would load `file`."""
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    return found is not None and found.origin is not None and Path(found.origin).resolve() == file


def import_attr(spec: str):
    """The object a `module.path:Attr` or `path/to/file.py:Attr` names."""
    found = file_id(spec)
    if found is not None:
        path, attr = found
        module = import_file(path)
        if not hasattr(module, attr):
            raise AttributeError(f"{module.__file__} defines no {attr!r}")
        return getattr(module, attr)
    module, _, name = spec.partition(":")
    return getattr(import_module(module), name)


def import_module(module: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        # `lucid train my_envs:MyEnv` from a project directory: console scripts do not put
        # the working directory on sys.path the way `python -m` does, so try it too.
        cwd = os.getcwd()
        if cwd in sys.path or (exc.name or "").split(".")[0] != module.split(".")[0]:
            raise
        sys.path.insert(0, cwd)
        try:
            return importlib.import_module(module)
        except BaseException:  # not found there either, or it raised: sys.path as it was
            sys.path.remove(cwd)
            raise
