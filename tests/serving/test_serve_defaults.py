"""cde-st-serve's defaults have one source (:mod:`cde_st.serving.defaults`): the command's options, the help texts
and the classes a script builds without the command (Settings, DynamicBatcher, Engine, ContextStore,
DrainingServer) agree, so a server started either way behaves the same."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from cde_st.serving import defaults, serve_command
from cde_st.serving.batching import DynamicBatcher
from cde_st.serving.contexts import ContextStore
from cde_st.serving.engine import Engine
from cde_st.serving.serve_command import build_parser


def _default(cls, name: str):
    return inspect.signature(cls).parameters[name].default


#: Each option's destination and the constant that declares its default.
DECLARED = {
    "host": "HOST",
    "port": "PORT",
    "dtype": "DTYPE",
    "backend": "BACKEND",
    "max_batch_size": "MAX_BATCH_SIZE",
    "max_wait_ms": "MAX_WAIT_MS",
    "max_queue": "MAX_QUEUE",
    "max_batch_tokens": "MAX_BATCH_TOKENS",
    "forward_overhead_tokens": "FORWARD_OVERHEAD_TOKENS",
    "model_process": "MODEL_PROCESS",
    "truncate": "TRUNCATE",
    "context_cache_mb": "CONTEXT_CACHE_MB",
    "workers": "WORKERS",
    "context_refresh_s": "CONTEXT_REFRESH_S",
    "max_inputs": "MAX_INPUTS",
    "max_body_mb": "MAX_BODY_MB",
    "max_connections": "MAX_CONNECTIONS",
    "read_timeout_s": "READ_TIMEOUT_S",
    "head_timeout_s": "HEAD_TIMEOUT_S",
    "max_connections_per_peer": "MAX_CONNECTIONS_PER_PEER",
    "keep_alive_s": "KEEP_ALIVE_S",
    "max_requests_per_connection": "MAX_REQUESTS_PER_CONNECTION",
    "max_connection_age_s": "MAX_CONNECTION_AGE_S",
    "drain_timeout_s": "DRAIN_TIMEOUT_S",
    "log_level": "LOG_LEVEL",
    "access_log": "ACCESS_LOG",
}
#: Options whose default is "not given" (None), each said in its help text.
UNSET = {"model", "state_dir", "served_model_name", "device", "onnx_file", "api_key_env", "listen_fd", "ready_fd"}


def test_the_options_defaults_are_the_constants():
    args = build_parser().parse_args(["some-model"])
    expected = {dest: getattr(defaults, name) for dest, name in DECLARED.items()}
    assert {dest: getattr(args, dest) for dest in expected} == expected
    assert defaults.CONTEXT_CACHE_BYTES == int(args.context_cache_mb * defaults.MIB)
    assert defaults.MAX_BODY_BYTES == int(args.max_body_mb * defaults.MIB)
    assert defaults.connections_per_peer(args.max_connections, args.max_connections_per_peer) == (
        defaults.MAX_CONNECTIONS // 2
    )


def test_every_option_is_declared_or_unset():
    """A new option with a default of its own fails here until its default is a constant of serving/defaults.py."""
    dests = {action.dest for action in build_parser()._actions if action.dest != "help"}
    assert dests == set(DECLARED) | UNSET
    args = build_parser().parse_args(["some-model"])
    assert {dest: getattr(args, dest) for dest in UNSET - {"model"}} == dict.fromkeys(UNSET - {"model"})


def test_the_command_writes_no_default_of_its_own():
    """Every ``default=`` in serve_command.py is None or a constant of serving/defaults.py: no literal repeated."""
    tree = ast.parse(Path(serve_command.__file__).read_text(encoding="utf-8"))
    given = [kw.value for node in ast.walk(tree) if isinstance(node, ast.Call) for kw in node.keywords
             if kw.arg == "default"]  # fmt: skip
    assert given
    for value in given:
        declared = (
            isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "defaults"
        )
        assert declared or (isinstance(value, ast.Constant) and value.value is None), ast.unparse(value)


def _flag_table() -> dict[str, str]:
    """docs/serving.md's flag table: each flag and its default cell (a row naming two flags gives two defaults)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text(encoding="utf-8")
    table = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("| `--") or len(cells) < 3:
            continue
        flags = [flag.strip("` ") for flag in cells[0].split(",")]
        values = cells[1].split(", ") if len(flags) > 1 else [cells[1]]
        assert len(values) == len(flags), line
        table.update(zip(flags, (value.strip() for value in values)))
    return table


def _documented(value) -> str | None:
    """How the table writes a default: a switch off as "off", a number as the parser has it, a word as itself."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (int, float)):
        return f"{value:g}"
    return None if value is None else value


def test_the_docs_flag_table_lists_every_option_with_the_parsers_default():
    table = _flag_table()
    visible = {action.option_strings[-1]: action.default for action in build_parser()._actions
               if action.option_strings and action.help != argparse.SUPPRESS and action.dest != "help"}  # fmt: skip
    assert set(table) == set(visible)
    for flag, default in visible.items():
        written = table[flag].strip("`")
        if default is None:  # not given: the table says what happens then, in words
            assert written and not written[0].isdigit(), (flag, table[flag])
        else:
            assert written == _documented(default), (flag, table[flag], default)


def test_the_help_texts_state_the_defaults():
    helps = {option: action.help for action in build_parser()._actions for option in action.option_strings}
    for option, value in [
        ("--max-batch-size", defaults.MAX_BATCH_SIZE),
        ("--max-wait-ms", f"{defaults.MAX_WAIT_MS:g}"),
        ("--max-queue", defaults.MAX_QUEUE),
        ("--context-cache-mb", f"{defaults.CONTEXT_CACHE_MB:g} MiB"),
        ("--max-inputs", defaults.MAX_INPUTS),
        ("--drain-timeout-s", f"{defaults.DRAIN_TIMEOUT_S:g}"),
        ("--head-timeout-s", f"{defaults.HEAD_TIMEOUT_S:g}"),
    ]:
        assert f"(default {value}" in helps[option], (option, helps[option])
    assert f"default {defaults.FORWARD_OVERHEAD_TOKENS})" in helps["--forward-overhead-tokens"]


def test_the_classes_defaults_are_the_commands():
    args = build_parser().parse_args(["some-model"])
    assert _default(Engine, "max_batch_size") == _default(DynamicBatcher, "max_batch_size") == args.max_batch_size
    assert _default(Engine, "max_batch_tokens") == _default(DynamicBatcher, "max_batch_tokens") == args.max_batch_tokens
    assert _default(DynamicBatcher, "max_wait") == args.max_wait_ms / 1000
    assert _default(DynamicBatcher, "max_queue") == args.max_queue
    assert _default(Engine, "backend") == args.backend
    assert _default(Engine, "dtype") == args.dtype
    assert _default(Engine, "model_process") == args.model_process
    assert _default(Engine, "context_cache_bytes") == int(args.context_cache_mb * defaults.MIB)
    assert _default(Engine, "context_batch_size") == defaults.CONTEXT_BATCH_SIZE
    assert _default(ContextStore, "refresh_seconds") == args.context_refresh_s


def test_the_apps_and_the_draining_servers_defaults_are_the_commands():
    pytest.importorskip("fastapi", reason="the server needs the serve extra (pip install -e '.[dev]')")
    from cde_st.serving.app import Settings
    from cde_st.serving.connections import ReadTimeoutH11Protocol
    from cde_st.serving.draining import DrainingServer

    args = build_parser().parse_args(["some-model"])
    settings = Settings()
    from_command = {
        "max_batch_size": args.max_batch_size,
        "max_wait_ms": args.max_wait_ms,
        "max_queue": args.max_queue,
        "max_inputs": args.max_inputs,
        "max_body_bytes": int(args.max_body_mb * defaults.MIB),
        "max_batch_tokens": args.max_batch_tokens,
        "truncate": args.truncate,
        "forward_overhead_tokens": args.forward_overhead_tokens,
    }
    assert {name: getattr(settings, name) for name in from_command} == from_command
    assert {f.name for f in dataclasses.fields(Settings)} == {"api_key", *from_command}  # none left unchecked
    assert _default(DrainingServer, "drain_timeout") == args.drain_timeout_s
    assert ReadTimeoutH11Protocol.read_timeout == args.read_timeout_s
    assert ReadTimeoutH11Protocol.head_timeout == args.head_timeout_s
