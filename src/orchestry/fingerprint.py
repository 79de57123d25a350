"""Content fingerprints of files too large to hash whole (model weights of hundreds of MB), and of model folders."""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from pathlib import Path

#: bytes read from each end of a large file
SAMPLE_BYTES = 1 << 20


def update_with_head_and_tail(h, path: str | Path, size: int, n: int = SAMPLE_BYTES) -> None:
    """Feed hash ``h`` (``hashlib``-like) the first and the last ``n`` bytes of the file ``path`` of ``size``
    bytes (the two overlap when the file is shorter than ``2 * n``).

    Raises:
        OSError: the file cannot be read.
    """
    with open(path, "rb") as fh:
        h.update(fh.read(n))
        fh.seek(max(0, size - n))
        h.update(fh.read(n))


def folder_fingerprint(path: str | Path, skip: Collection[str] = ()) -> str:
    """16 hex digits of SHA-256 over a model folder: the names and bytes of its ``*.json``/``*.jinja`` files and,
    for each ``*.safetensors``/``*.bin`` file, its name, size and first and last MiB (:func:`update_with_head_and_tail`),
    in name order; files named in ``skip`` are left out.

    Raises:
        OSError: the folder or a file in it cannot be read.
    """
    h = hashlib.sha256()
    for f in sorted(Path(path).iterdir()):
        if f.name in skip:
            continue
        if f.suffix in (".json", ".jinja"):
            h.update(f.name.encode() + f.read_bytes())
        elif f.suffix in (".safetensors", ".bin"):
            size = f.stat().st_size
            h.update(f"{f.name}:{size}".encode())
            update_with_head_and_tail(h, f, size)
    return h.hexdigest()[:16]


def package_fingerprint(root: str | Path | None = None) -> str:
    """16 hex digits of SHA-256 over the relative paths and bytes of every ``*.py`` file under ``root`` (default:
    the installed ``orchestry`` package), in path order: any change to the code gives another fingerprint.

    Raises:
        OSError: a file cannot be read.
    """
    root = Path(root) if root is not None else Path(__file__).parent
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]
