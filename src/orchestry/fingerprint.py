"""Content fingerprints of files too large to hash whole (model weights of hundreds of MB)."""

from __future__ import annotations

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
