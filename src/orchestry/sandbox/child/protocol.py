"""Messages between the worker's processes: framing (4-byte big-endian length + JSON), the exceptions shared by
its roles, and the short text an exception is reported as."""

from __future__ import annotations

import json
import os
import struct

_LEN = struct.Struct(">I")


# ----------------------------------------------------------------------------------------- framing
class ChannelClosed(Exception):
    """The other end of a pipe closed (EOF) or broke."""


class ChannelProtocolError(Exception):
    """A message was malformed or too large."""


def write_msg_blocking(fd: int, obj) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8", "surrogatepass")
    data = _LEN.pack(len(data)) + data
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_exact_blocking(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        b = os.read(fd, min(n, 1 << 20))
        if not b:
            raise ChannelClosed("EOF")
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def read_msg_blocking(fd: int, max_bytes: int = 1 << 30):
    (n,) = _LEN.unpack(read_exact_blocking(fd, 4))
    if n > max_bytes:
        raise ChannelProtocolError(f"message of {n} bytes exceeds the limit of {max_bytes}")
    return json.loads(read_exact_blocking(fd, n).decode("utf-8", "surrogatepass"))


class _UnitTimeout(Exception):
    """The current assert unit (or load) of the scorer ran out of time."""


def _short(text: str, n: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _describe(e: BaseException) -> str:
    try:
        name = type(e).__name__
        if isinstance(e, SyntaxError):
            msg = f"{e.msg} (line {e.lineno})" if e.lineno is not None else str(e.msg)
        else:
            msg = str(e)
    except BaseException:  # noqa: BLE001 - a hostile exception may break str()
        return "exception (undescribable)"
    return _short(f"{name}: {msg}" if msg else name)
