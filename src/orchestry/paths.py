"""Where the repository is: its root (``DVC_ROOT`` in DVC experiments, else the working directory) and paths
relative to it, so that what a stage writes does not depend on where the repository was cloned."""

from __future__ import annotations

import os
from pathlib import Path


def repo_root() -> Path:
    """``DVC_ROOT`` if set, else the current working directory."""
    return Path(os.environ.get("DVC_ROOT") or os.getcwd()).resolve()


def resolve_path(path: str | Path) -> Path:
    """``path`` relative to the repository root (``DVC_ROOT`` in DVC experiments), absolute kept."""
    p = Path(path)
    return p if p.is_absolute() else repo_root() / p


def repo_relative(path: str | Path) -> str:
    """The inverse of :func:`resolve_path`: ``path`` relative to the repository root when it lies inside it (so
    the metrics a stage writes do not depend on where the repository was cloned), else as given."""
    try:
        return Path(path).resolve().relative_to(repo_root()).as_posix()
    except ValueError:
        return str(path)
