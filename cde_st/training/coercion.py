"""Config values as the types their fields declare: the one coercion rule of training configs.

A value read from YAML, JSON or ``--set`` is converted only where the intent is unambiguous (``"1e-3"`` -> float,
``4.0`` -> int, one path -> ``[path]`` where a list is expected); anything else is a ``TypeError`` that names the
field, the value and the expected type. :mod:`cde_st.training.config` applies it to every field.
"""

from __future__ import annotations

import types
import typing
from typing import Any


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def coerce(value: Any, hint: Any, name: str) -> Any:
    """``value`` as type ``hint``, converting only where the intent is unambiguous (``"1e-3"`` -> float, ``4.0``
    -> int, one path -> ``[path]`` for a list); a ``TypeError`` naming field ``name``, the value and ``hint``
    otherwise."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    mismatch = TypeError(f"field {name!r} = {_describe(value)}: expected {type_name(hint)}")
    if hint is Any:
        return value
    if hint is type(None):
        if value is None:
            return None
        raise mismatch
    if origin in (typing.Union, types.UnionType):
        exact = [a for a in args if a is not Any and isinstance(value, typing.get_origin(a) or a)]
        exact = [a for a in exact if not (isinstance(value, bool) and a in (int, float))]
        for candidate in exact + [a for a in args if a not in exact]:
            try:
                return coerce(value, candidate, name)
            except TypeError:
                continue
        raise mismatch
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
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
    return getattr(hint, "__name__", str(hint))
