"""Plain data across the process boundary: :func:`encode`/:func:`decode` (program side, parent side) and the
scorer's guarded :class:`_Decoder` for values a program sent."""

from __future__ import annotations

import time

from .protocol import _UnitTimeout


# ------------------------------------------------------------------------------- plain-data codec
class Unplain(TypeError):
    """A value that is not made of built-in data types (cannot cross the process boundary)."""


_INT_LIMIT = 1 << 62


def encode(x, liberal: bool = False):
    """Encode built-in data (None, bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set,
    frozenset; nested) as JSON-able values. ``liberal`` (program side only) also converts subclasses of those
    types, numpy scalars and dict key views. Raises :class:`Unplain` for anything else."""
    t = type(x)
    if t is str or t is bool or t is float or x is None:
        return x
    if t is int:
        return x if -_INT_LIMIT < x < _INT_LIMIT else {"i": format(x, "x")}
    if t is list:
        return [encode(e, liberal) for e in x]
    if t is tuple:
        return {"t": [encode(e, liberal) for e in x]}
    if t is dict:
        return {"d": [[encode(k, liberal), encode(v, liberal)] for k, v in x.items()]}
    if t is set:
        return {"s": [encode(e, liberal) for e in x]}
    if t is frozenset:
        return {"f": [encode(e, liberal) for e in x]}
    if t is complex:
        return {"c": [x.real, x.imag]}
    if t is bytes:
        return {"b": x.hex()}
    if t is bytearray:
        return {"y": x.hex()}
    if liberal:
        return _encode_liberal(x, t)
    raise Unplain(t.__name__)


def _encode_liberal(x, t):
    for base, conv in (
        (bool, bool),
        (int, int),
        (float, float),
        (str, str.__str__),
        (complex, complex),
        (bytes, bytes),
        (bytearray, bytearray),
        (list, list),
        (tuple, tuple),
        (dict, dict),
        (set, set),
        (frozenset, frozenset),
    ):
        if isinstance(x, base):
            return encode(base(conv(x)) if conv is not base else base(x), True)
    mod = getattr(t, "__module__", "") or ""
    if mod.split(".")[0] == "numpy" and hasattr(x, "item") and getattr(x, "ndim", None) == 0:
        return encode(x.item(), True)
    if t is type({}.keys()):
        return encode(set(x), True)
    raise Unplain(getattr(t, "__name__", "?"))


def decode(v):
    """Inverse of :func:`encode`; accepts only what ``encode`` produces (ValueError otherwise)."""
    t = type(v)
    if t is list:
        return [decode(e) for e in v]
    if t is dict:
        if len(v) != 1:
            raise ValueError("bad tagged value")
        ((tag, p),) = v.items()
        if tag == "i" and type(p) is str:
            return int(p, 16)
        if tag == "t" and type(p) is list:
            return tuple(decode(e) for e in p)
        if tag == "d" and type(p) is list:
            out = {}
            for kv in p:
                if type(kv) is not list or len(kv) != 2:
                    raise ValueError("bad dict item")
                out[decode(kv[0])] = decode(kv[1])
            return out
        if tag == "s" and type(p) is list:
            return {decode(e) for e in p}
        if tag == "f" and type(p) is list:
            return frozenset(decode(e) for e in p)
        if tag == "c" and type(p) is list and len(p) == 2 and all(type(e) in (int, float) for e in p):
            return complex(p[0], p[1])
        if tag == "b" and type(p) is str:
            return bytes.fromhex(p)
        if tag == "y" and type(p) is str:
            return bytearray.fromhex(p)
        raise ValueError(f"bad tag {tag!r}")
    if t is str or t is int or t is float or t is bool or v is None:
        return v
    raise ValueError(f"bad value type {t.__name__}")


class _Decoder:
    """Scorer-side :func:`decode` for values a program sent: at most ``max_nodes`` values in all, and the
    clock is checked while decoding (raises ``_UnitTimeout`` past ``deadline``, a ``time.monotonic()`` value).
    Sets and dict keys are inserted one at a time with a clock check each, so that values built to collide in
    a hash table (quadratic insertion) cannot hold the scorer past the unit's time. Raises ValueError for
    anything :func:`encode` does not produce or a value over the node budget."""

    __slots__ = ("deadline", "left", "n", "by_hash", "collisions")

    #: distinct values sharing one hash that a reply may hold: a test that builds a set of a program's result
    #: (``len(set(candidate(...)))``) does so in one C call the unit's timer cannot interrupt, so values built
    #: to collide are refused here instead
    MAX_COLLISIONS = 64

    def __init__(self, deadline: float, max_nodes: int) -> None:
        self.deadline = deadline
        self.left = max_nodes
        self.n = 0
        self.by_hash: dict = {}
        self.collisions = 0

    def _check_hash(self, v) -> None:
        try:
            h = hash(v)
        except TypeError:  # holds a list, dict or set somewhere
            return
        first = self.by_hash.setdefault(h, v)
        if first is not v and first != v:
            self.collisions += 1
            if self.collisions > self.MAX_COLLISIONS:
                raise ValueError("values built to collide in a hash table")

    def _tick(self, clock: bool = False) -> None:
        self.left -= 1
        if self.left < 0:
            raise ValueError("value has too many parts")
        self.n += 1
        if (clock or not self.n & 255) and time.monotonic() > self.deadline:
            raise _UnitTimeout()

    def decode(self, v):
        self._tick()
        t = type(v)
        if t is str or t is int or t is float:
            self._check_hash(v)
            return v
        if t is bool or v is None:
            return v
        if t is list:
            return [self.decode(e) for e in v]
        if t is not dict or len(v) != 1:
            raise ValueError("bad value")
        ((tag, p),) = v.items()
        if tag in ("i", "b", "y") and type(p) is str:
            if len(p) > 1 << 22:
                raise ValueError("value too large")
            x = int(p, 16) if tag == "i" else bytes.fromhex(p) if tag == "b" else bytearray.fromhex(p)
            if tag != "y":
                self._check_hash(x)
            return x
        if type(p) is not list:
            raise ValueError("bad tagged value")
        if tag == "t":
            tup = tuple(self.decode(e) for e in p)
            self._check_hash(tup)  # every level: hashing costs its size, bounded by the budget and the clock
            return tup
        if tag == "d":
            out: dict = {}
            self.fill_dict(out, p)
            return out
        if tag in ("s", "f"):
            out_s: set = set()
            self.fill_set(out_s, p)
            if tag == "s":
                return out_s
            fs = frozenset(out_s)
            self._check_hash(fs)
            return fs
        if tag == "c" and len(p) == 2 and all(type(e) in (int, float) for e in p):
            c = complex(p[0], p[1])
            self._check_hash(c)
            return c
        raise ValueError(f"bad tag {str(tag)[:20]!r}")

    def fill_set(self, out: set, items: list, decoded: bool = False) -> None:
        add = out.add
        for e in items:
            self._tick(True)
            add(e if decoded else self.decode(e))

    def fill_dict(self, out: dict, items, decoded: bool = False) -> None:
        for kv in items:
            self._tick(True)
            if decoded:
                k, val = kv
            else:
                if type(kv) is not list or len(kv) != 2:
                    raise ValueError("bad dict item")
                k, val = self.decode(kv[0]), self.decode(kv[1])
            out[k] = val
