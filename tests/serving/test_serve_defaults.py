"""cde-st-serve's defaults have one source (:mod:`cde_st.serving.defaults`): the command's options, the help texts
and the classes a script builds without the command (Settings, DynamicBatcher, Engine, ContextStore,
DrainingServer) agree, so a server started either way behaves the same."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from cde_st.serving import defaults
from cde_st.serving.batching import DynamicBatcher
from cde_st.serving.contexts import ContextStore
from cde_st.serving.engine import Engine
from cde_st.serving.serve_command import build_parser


def _default(cls, name: str):
    return inspect.signature(cls).parameters[name].default


def test_the_options_defaults_are_the_constants():
    args = build_parser().parse_args(["some-model"])
    expected = {
        "host": defaults.HOST,
        "port": defaults.PORT,
        "backend": defaults.BACKEND,
        "max_batch_size": defaults.MAX_BATCH_SIZE,
        "max_wait_ms": defaults.MAX_WAIT_MS,
        "max_queue": defaults.MAX_QUEUE,
        "max_batch_tokens": defaults.MAX_BATCH_TOKENS,
        "forward_overhead_tokens": defaults.FORWARD_OVERHEAD_TOKENS,
        "context_cache_mb": defaults.CONTEXT_CACHE_MB,
        "workers": defaults.WORKERS,
        "context_refresh_s": defaults.CONTEXT_REFRESH_S,
        "max_inputs": defaults.MAX_INPUTS,
        "max_body_mb": defaults.MAX_BODY_MB,
        "max_connections": defaults.MAX_CONNECTIONS,
        "read_timeout_s": defaults.READ_TIMEOUT_S,
        "head_timeout_s": defaults.HEAD_TIMEOUT_S,
        "max_connections_per_peer": defaults.MAX_CONNECTIONS_PER_PEER,
        "keep_alive_s": defaults.KEEP_ALIVE_S,
        "max_requests_per_connection": defaults.MAX_REQUESTS_PER_CONNECTION,
        "max_connection_age_s": defaults.MAX_CONNECTION_AGE_S,
        "drain_timeout_s": defaults.DRAIN_TIMEOUT_S,
    }
    assert {name: getattr(args, name) for name in expected} == expected
    assert defaults.CONTEXT_CACHE_BYTES == int(args.context_cache_mb * defaults.MIB)
    assert defaults.MAX_BODY_BYTES == int(args.max_body_mb * defaults.MIB)


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


def test_the_classes_defaults_are_the_commands():
    args = build_parser().parse_args(["some-model"])
    assert _default(Engine, "max_batch_size") == _default(DynamicBatcher, "max_batch_size") == args.max_batch_size
    assert _default(Engine, "max_batch_tokens") == _default(DynamicBatcher, "max_batch_tokens") == args.max_batch_tokens
    assert _default(DynamicBatcher, "max_wait") == args.max_wait_ms / 1000
    assert _default(DynamicBatcher, "max_queue") == args.max_queue
    assert _default(Engine, "backend") == args.backend
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
