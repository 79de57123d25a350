"""Reading ``params.yaml`` (and files in its format): strict YAML, then validation by :class:`orchestry.config.Params`.

A key written twice in one mapping is an error (:class:`UniqueKeyLoader`; PyYAML keeps the last of two equal keys,
so a section written twice would silently reset its other keys to the defaults), and every validation error
becomes one line naming the key, with the allowed keys or values (:class:`ParamsError`). Experiment presets and
search spaces are read with the same loader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from orchestry.config import Params


class ParamsError(ValueError):
    """``params.yaml`` is invalid; the message names each bad key with the allowed values."""


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key written twice in one mapping is an error (PyYAML keeps the last one, so a
    repeated section would silently reset its other keys to the defaults)."""

    def construct_document(self, node: yaml.Node) -> Any:
        self._check_unique_keys(node, (), set())
        return super().construct_document(node)

    def _check_unique_keys(self, node: yaml.Node, path: tuple[str, ...], visited: set[int]) -> None:
        if id(node) in visited:  # an alias of an anchor already checked (or a recursive one)
            return
        visited.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._check_unique_keys(item, (*path, str(i)), visited)
            return
        if not isinstance(node, yaml.MappingNode):
            return
        first_line: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: explicit keys may override it
                self._check_unique_keys(value_node, path, visited)
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in first_line:
                    name = ".".join((*path, str(key)))
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"line {line}: duplicate key '{name}' (first at line {first_line[key]}); "
                        "remove one of them",
                        key_node.start_mark,
                    )
                first_line[key] = line
            except TypeError:  # an unhashable key: the constructor reports it
                pass
            self._check_unique_keys(value_node, (*path, str(key)), visited)


def _allowed_for(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names allowed at the parent of ``loc`` (for 'unknown key' messages)."""
    cur: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = cur.model_fields.get(part) if isinstance(cur, type) and issubclass(cur, BaseModel) else None
        if field is None:
            return []
        cur = field.annotation
    if isinstance(cur, type) and issubclass(cur, BaseModel):
        return list(cur.model_fields)
    return []


def format_validation_error(err: ValidationError, source: str = "params.yaml") -> str:
    lines = [f"{source} is invalid:"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            allowed = _allowed_for(Params, e["loc"])
            lines.append(f"  {key}: unknown key (allowed: {', '.join(allowed)})")
        elif not key:  # a check across sections: its message names the keys
            lines.append(f"  {e['msg'].removeprefix('Value error, ')}")
        elif isinstance(e.get("input"), dict):  # a check across a section's keys: the message names them
            lines.append(f"  {key}: {e['msg'].removeprefix('Value error, ')}")
        else:
            got = repr(e.get("input"))
            lines.append(f"  {key}: {e['msg']} (got {got if len(got) <= 80 else got[:77] + '...'})")
    return "\n".join(lines)


def parse_params(data: dict | None, source: str = "params.yaml") -> Params:
    """Validate a params mapping.

    Raises:
        ParamsError: naming every unknown key (with the allowed keys) and bad value (with the allowed values).
    """
    data = dict(data or {})
    try:
        return Params.model_validate(data)
    except ValidationError as e:
        raise ParamsError(format_validation_error(e, source)) from None


def read_params_mapping(path: str | Path = "params.yaml") -> dict:
    """The mapping a params file holds, read strictly (:class:`UniqueKeyLoader`) but not validated: for code that
    patches or flattens it (experiment presets, searches, the smoke copy, MLflow params).

    Raises:
        ParamsError: the file is missing or unreadable, not YAML, empty or only comments (every setting would be
            a default, silently), has a key twice, or is not a mapping.
    """
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path} not found")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ParamsError(f"{path} cannot be read: {e}") from None
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise ParamsError(f"{path} is not valid YAML: {e}") from None
    except RecursionError:
        raise ParamsError(f"{path} is not valid YAML: nested too deeply") from None
    if data is None or data == {}:  # an empty or comment-only file would run every default silently
        raise ParamsError(
            f"{path} is empty (no sections, only blanks or comments): every setting would be a default; write the "
            "sections to use (the committed params.yaml spells out every default)"
        )
    if not isinstance(data, dict):
        raise ParamsError(f"{path} must be a mapping of sections, got {type(data).__name__}")
    return data


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read (:func:`read_params_mapping`) and validate (:func:`parse_params`) ``params.yaml``.

    Raises:
        ParamsError: the file is missing or unreadable, not YAML, has a key twice, or a bad key/value.
    """
    return parse_params(read_params_mapping(path), str(Path(path)))
