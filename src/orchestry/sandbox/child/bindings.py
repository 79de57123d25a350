"""What the tests see of a program: the modules its globals may name, which names are bound, its exceptions
re-raised as built-in types, and in-place changes to arguments mirrored back."""

from __future__ import annotations

import builtins
import contextlib
from keyword import iskeyword as _iskeyword

from .codec import _Decoder

_BUILTIN_NAMES = frozenset(dir(builtins))

# Modules a program's globals may bind in the tests' namespace (``import math`` in a HumanEval prompt, used by its
# test). The scorer imports exactly these itself, once, before any job; a program's load report only *names* one
# of them and the scorer looks the name up in this fixed table: it never imports (or evaluates) anything a program
# names or writes. Any other module global is left out of the test namespace.
TEST_MODULES = (
    "bisect",
    "cmath",
    "collections",
    "copy",
    "datetime",
    "decimal",
    "fractions",
    "functools",
    "hashlib",
    "heapq",
    "itertools",
    "json",
    "math",
    "operator",
    "random",
    "re",
    "statistics",
    "string",
    "typing",
)


class RemoteError(Exception):
    """An exception raised by program code that has no built-in counterpart (message ``Type: text``)."""


# Program exceptions re-raised in the tests as the built-in type of the same name, except those that act as
# control flow in the harness: StopIteration would end a test's ``map``/``filter``/``zip`` early (``all(map(
# candidate, xs))`` would pass for a function that raises it); they come back as RemoteError.
_CONTROL_FLOW = frozenset({"StopIteration", "StopAsyncIteration", "GeneratorExit"})
_REMOTE_OK = {
    name: cls
    for name, cls in vars(builtins).items()
    if isinstance(cls, type)
    and issubclass(cls, Exception)
    and cls.__module__ == "builtins"
    and name not in _CONTROL_FLOW
}


def _remote_exception(tname: str, msg: str) -> BaseException:
    cls = _REMOTE_OK.get(tname)
    if cls is not None:
        try:
            return cls(msg)
        except Exception:  # noqa: BLE001 - e.g. UnicodeDecodeError needs 5 arguments
            pass
    return RemoteError(f"{tname}: {msg}" if msg else tname)


def _apply_mutation(arg, after, dec: _Decoder) -> None:
    """Reflect, on the scorer's argument object, an in-place change the program made to its copy (the new
    value must have the argument's type; sets and dicts are refilled one item at a time under the clock)."""
    t = type(arg)
    if type(after) is not t:
        raise ValueError("mutation changes the argument's type")
    if t is list or t is bytearray:
        arg[:] = after
    elif t is dict:
        arg.clear()
        dec.fill_dict(arg, list(after.items()), decoded=True)
    elif t is set:
        arg.clear()
        dec.fill_set(arg, list(after), decoded=True)


_TEST_MODULE_OBJECTS: dict[str, object] = {}
_MAX_GLOBALS = 10_000  # names in a load report


def _import_test_modules() -> None:
    """Import :data:`TEST_MODULES` in the scorer (at start-up, before any job: no program exists yet)."""
    import importlib

    for name in TEST_MODULES:
        with contextlib.suppress(Exception):
            _TEST_MODULE_OBJECTS[name] = importlib.import_module(name)


def _test_module(name: str):
    """The scorer's own module object for ``name`` if it is in the fixed allow-list, else None. No import."""
    return _TEST_MODULE_OBJECTS.get(name) if type(name) is str else None


def _bindable(name) -> bool:
    """May a program's global named ``name`` be bound in the tests' namespace? Not a builtin's name, not a
    keyword, not a dunder (``__builtins__``, ``__name__``...): the tests always run under the scorer's own
    builtins."""
    return (
        type(name) is str
        and name.isidentifier()
        and not (name.startswith("__") and name.endswith("__"))
        and name not in _BUILTIN_NAMES
        and not _iskeyword(name)
    )
