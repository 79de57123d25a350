"""The strict base of every ``params.yaml`` section (:class:`_Section`: unknown keys, ``inf``/``nan`` and coerced
scalars are refused) and the field types the sections share (:data:`Seed`, :data:`Name`, :data:`BIG`).
"""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

Seed = Annotated[int, Field(ge=0, le=2**32 - 1, description="RNG seed")]
Name = Annotated[str, Field(min_length=1)]
BIG = 1_000_000  # upper bound of counts that have no natural one (steps, problems, bootstrap resamples)


def _scalar_kinds(annotation: Any) -> set | None:
    """The scalar types a field takes (``int``, ``float``, ``bool``, ``str``, ``None``, ``("literal", v)``), or None
    when it takes anything else too (a section, a list, a dict)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _scalar_kinds(get_args(annotation)[0])
    if origin in (Union, UnionType):
        parts = [_scalar_kinds(a) for a in get_args(annotation)]
        return None if any(p is None for p in parts) else set().union(*parts)  # type: ignore[arg-type]
    if origin is Literal:
        return {("literal", v) for v in get_args(annotation)}
    if annotation in (int, float, bool, str):
        return {annotation}
    if annotation is type(None):
        return {None}
    return None


def _fits(kinds: set, value: Any) -> bool:
    """``value`` is one of ``kinds`` as it is, without pydantic's coercions (bool -> int, str -> int, 3.0 -> 3)."""
    if value is None:
        return None in kinds
    if isinstance(value, bool):
        return bool in kinds or ("literal", value) in kinds
    if isinstance(value, int):
        return bool(kinds & {int, float}) or any(
            k == ("literal", value) for k in kinds if isinstance(k, tuple)
        )
    if isinstance(value, float):
        return float in kinds
    if isinstance(value, str):
        return str in kinds or ("literal", value) in kinds
    return True  # other objects: pydantic's own checks


def _strict(annotation: Any, value: Any) -> None:
    """Raise ValueError when ``value`` (or an item of a list, a value of a dict) would only fit ``annotation``
    through a coercion: ``true`` or ``'3'`` for a count, ``3.0`` for an integer, ``'yes'`` for a flag."""
    kinds = _scalar_kinds(annotation)
    if kinds is not None:
        if not _fits(kinds, value):
            want = sorted(
                "an integer" if k is int else "a number" if k is float else "true/false" if k is bool
                else "a string" if k is str else "null" if k is None else repr(k[1])
                for k in kinds
            )  # fmt: skip
            raise ValueError(f"expected {' or '.join(want)}, not {type(value).__name__}")
        return
    origin = get_origin(annotation)
    if origin is Annotated:
        _strict(get_args(annotation)[0], value)
    elif origin in (Union, UnionType):
        for arg in get_args(annotation):
            if get_origin(arg) in (list, dict) or get_origin(arg) is Annotated:
                _strict(arg, value)
    elif origin is list and isinstance(value, list):
        for item in value:
            _strict(get_args(annotation)[0], item)
    elif origin is dict and isinstance(value, dict):
        for item in value.values():
            _strict(get_args(annotation)[1], item)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_coercion(cls, value: Any, info: ValidationInfo) -> Any:
        """Strict scalars: no bool -> int, str -> int, 3.0 -> 3 or 'yes' -> true (``num_samples: true`` and
        ``num_samples: '3'`` are refused, not read as 1 and 3)."""
        field = cls.model_fields.get(info.field_name or "")
        if field is not None:
            _strict(field.annotation, value)
        return value


def _unique(values: list | None) -> list | None:
    dup = sorted({v for v in values or [] if values.count(v) > 1})
    if dup:
        raise ValueError(f"listed twice: {', '.join(map(str, dup))}")
    return values
