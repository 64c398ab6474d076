"""Config values as the types their fields declare: the one coercion rule of every configuration entry point.

Every route into a config goes through :func:`coerce`: ``TrainConfig`` (Python, YAML/JSON files, ``--set``),
``ContextualConfig`` (Python, ``dataclasses.replace``, ``cde_config.json``) and the released checkpoints'
``config.json`` (:mod:`cde_st.released`). The rule:

- a ``bool`` field takes only a real boolean (``True``/``False``; numpy's too). The strings ``"false"``/``"no"``
  and the numbers 0/1 are refused: ``bool("false")`` is True, so any conversion would guess. Text entry points
  (YAML files, ``--set``) read the words ``true`` and ``false`` (any case) as booleans, and only those
  (:func:`load_config_text`; YAML 1.1's ``yes``/``no``/``on``/``off`` stay text).
- an ``int`` field takes a whole number: an int, a float with no fraction (``4.0``), or the text of one (``"4"``);
  ``8.7``, ``True`` and ``"eight"`` are refused.
- a ``float`` field takes a finite or infinite real number or its text (``"1e-3"``); booleans are refused.
- a ``str`` field takes only text; a ``list[str]`` takes one string as a one-item list (one path).
- a ``Literal[...]`` field (a choice) takes only one of its values, of the same type (``"auto"``, not ``"Auto"``);
  the error names the field and lists the allowed values.

Anything else is a :class:`ConfigValueError` (both a ``TypeError`` and a ``ValueError``) naming the field, the value
and the expected type.
"""

from __future__ import annotations

import json
import math
import numbers
import re
import types
import typing
from typing import Any

import numpy as np
import yaml


class ConfigValueError(TypeError, ValueError):
    """A config value of the wrong type: names the field, the value and the type it must have."""


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _is_instance(value: Any, hint: Any) -> bool:
    """Whether ``value`` already has type ``hint`` (for a ``Literal``: is one of its values, of the same type)."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return any(value == choice and type(value) is type(choice) for choice in typing.get_args(hint))
    return isinstance(value, origin or hint)


def coerce(value: Any, hint: Any, name: str, rule: str | None = None) -> Any:
    """``value`` as type ``hint`` by the module's rule; a :class:`ConfigValueError` naming field ``name``, the value
    and ``hint`` otherwise (``rule``: what the field must be, added to the message)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if rule:
        message = f"field {name!r}: {rule}, got {_describe(value)} (expected {type_name(hint)})"
    else:
        message = f"field {name!r} = {_describe(value)}: expected {type_name(hint)}"
    mismatch = ConfigValueError(message)
    if hint is Any:
        return value
    if hint is type(None):
        if value is None:
            return None
        raise mismatch
    if origin in (typing.Union, types.UnionType):
        exact = [a for a in args if a is not Any and _is_instance(value, a)]
        exact = [a for a in exact if not (isinstance(value, bool) and a in (int, float))]
        inner = None
        for candidate in exact + [a for a in args if a not in exact]:
            try:
                return coerce(value, candidate, name)
            except ConfigValueError as err:
                if candidate in exact and inner is None and typing.get_origin(candidate) in (list, dict):
                    inner = err  # the container is right, an item is not: name the item
        raise inner if inner is not None else mismatch
    if origin is typing.Literal:
        if _is_instance(value, hint):
            return value
        raise ConfigValueError(f"field {name!r} = {_describe(value)}: expected one of {list(args)}")
    if hint is bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
    elif hint is int:
        if _is_int(value):
            return int(value)
        if _is_real(value) and math.isfinite(value) and float(value).is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
    elif hint is float:
        if _is_real(value):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
    elif hint is str:
        if isinstance(value, str):
            return value
    elif origin is list:
        (item_hint,) = args or (Any,)
        if isinstance(value, str) and item_hint is str:
            return [value]  # one path/name where a list is expected
        if isinstance(value, (list, tuple)):
            return [coerce(v, item_hint, f"{name}[{i}]") for i, v in enumerate(value)]
    elif origin is dict:
        key_hint, value_hint = args or (Any, Any)
        if isinstance(value, dict):
            return {
                coerce(k, key_hint, f"{name} key {k!r}"): coerce(v, value_hint, f"{name}[{k!r}]")
                for k, v in value.items()
            }
    else:  # a hint this checker does not know: leave the value alone
        return value
    raise mismatch


def type_name(hint: Any) -> str:
    """How an error message names type ``hint`` (``"int or null"``, ``"a list of str (or one str)"``)."""
    if hint is type(None):
        return "null"
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(hint))
    if typing.get_origin(hint) is list:
        return f"a list of {type_name(typing.get_args(hint)[0])} (or one {type_name(typing.get_args(hint)[0])})"
    if typing.get_origin(hint) is dict:
        return "a dict (mapping)"
    if typing.get_origin(hint) is typing.Literal:
        choices = typing.get_args(hint)
        return repr(choices[0]) if len(choices) == 1 else "one of " + ", ".join(repr(a) for a in choices)
    return getattr(hint, "__name__", str(hint))


# ------------------------------------------------------------------------------------------- config file text
class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans and floats: only true/false are booleans (YAML 1.1 also reads
    yes/no/on/off, so a domain named ``no`` became False), and ``1e-3`` is a float (YAML 1.1 wants ``1.0e-3``)."""


_ConfigLoader.yaml_implicit_resolvers = {
    first: [
        (tag, regexp) for tag, regexp in resolvers if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:float")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def load_yaml_value(text: str) -> Any:
    """One YAML value (a ``--set`` value) read by the rule of config files (:func:`load_config_text`)."""
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass


def _duplicates_in_yaml(node: Any, where: str, path: str = "") -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                name = f"{path}{key.value}"
                line = key.start_mark.line + 1
                if key.value in seen:
                    raise ConfigValueError(
                        f"{where}, line {line}: key {name!r} appears twice (first on line {seen[key.value]}); a "
                        "config file must give each key once (which one was meant?). Remove one of them."
                    )
                seen[key.value] = line
                _duplicates_in_yaml(value, where, f"{name}.")
            else:
                _duplicates_in_yaml(value, where, path)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _duplicates_in_yaml(item, where, path)


def _json_key_lines(text: str) -> dict[str, list[int]]:
    """The lines on which each quoted JSON key appears (for naming where a duplicate is)."""
    lines: dict[str, list[int]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        for match in re.finditer(r'"((?:[^"\\]|\\.)*)"\s*:', line):
            lines.setdefault(match.group(1), []).append(number)
    return lines


def load_config_text(text: str, where: str) -> Any:
    """A YAML or JSON config file's text (JSON when ``where`` ends in ``.json``), read by one rule: a key given twice
    in any mapping is a :class:`ConfigValueError` naming the key, ``where`` and the line (YAML and JSON parsers keep
    the last value silently); YAML reads only true/false as booleans. Syntax errors are the parsers' own."""
    if str(where).endswith(".json"):
        return _unique_json(json.loads(text, object_pairs_hook=_Pairs), where, _json_key_lines(text))
    node = yaml.compose(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass
    _duplicates_in_yaml(node, where)
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass


class _Pairs(list):
    """A JSON object as its (key, value) pairs, kept until its keys are checked."""


def _unique_json(value: Any, where: str, key_lines: dict[str, list[int]], path: str = "") -> Any:
    if isinstance(value, _Pairs):
        out: dict[str, Any] = {}
        for key, item in value:
            if key in out:
                found = key_lines.get(key, [])
                at = f", line {found[1]}" if len(found) > 1 else ""
                first = f" (first on line {found[0]})" if len(found) > 1 else ""
                raise ConfigValueError(
                    f"{where}{at}: key {path + key!r} appears twice{first}; a config file must give each key once "
                    "(which one was meant?). Remove one of them."
                )
            out[key] = _unique_json(item, where, key_lines, f"{path}{key}.")
        return out
    if isinstance(value, list):
        return [_unique_json(v, where, key_lines, path) for v in value]
    return value
