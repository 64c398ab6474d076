"""``cde-st-serve MODEL``: load the model, the stored contexts and start the HTTP server (uvicorn)."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import typing
from functools import partial

from cde_st.backend_options import add_backend_options
from cde_st.command_line import CommandParser, Number
from cde_st.serving import defaults

logger = logging.getLogger("cde_st.serving")

COUNT = Number(int, at_least=1)  # sizes, counts and limits: 0 would serve nothing
PORT = Number(int, at_least=0, at_most=65535)
FD = Number(int, at_least=0)


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(  # errors: one line naming the option, exit status 2
        prog="cde-st-serve",
        description="An OpenAI-compatible embedding server with named corpus contexts (docs/serving.md).",
    )
    p.add_argument(
        "model",
        help="a saved cde_st folder, a released CDE model (folder or hub id) or any sentence-transformers model",
    )
    p.add_argument(
        "--host", default=defaults.HOST, help=f"address to bind (default {defaults.HOST}: this machine only)"
    )
    p.add_argument("--port", type=PORT, default=defaults.PORT, help="port (0: any free port; the log line says which)")
    p.add_argument(
        "--state-dir",
        default=None,
        help="folder for the stored contexts (default: none; contexts then live in memory only)",
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the name requests give as 'model' (default: the folder's name or the hub id)",
    )
    p.add_argument("--device", default=None, help="torch device (default: sentence-transformers' choice)")
    p.add_argument("--dtype", default=defaults.DTYPE, choices=["float32", "float16", "bfloat16"])
    add_backend_options(p, default=defaults.BACKEND)
    _batching_options(p.add_argument_group("batching"))
    _context_options(p.add_argument_group("contexts and replicas"))
    _request_options(p.add_argument_group("requests"))
    _connection_options(p.add_argument_group("connections"))
    p.add_argument("--log-level", default=defaults.LOG_LEVEL, choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument(
        "--access-log",
        action="store_true",
        default=defaults.ACCESS_LOG,
        help="log every request (off: it costs throughput)",
    )
    return p


def _batching_options(p) -> None:  # an argument group of the parser
    p.add_argument(
        "--max-batch-size",
        type=COUNT,
        default=defaults.MAX_BATCH_SIZE,
        help=f"texts per forward pass (default {defaults.MAX_BATCH_SIZE})",
    )
    p.add_argument(
        "--max-wait-ms",
        type=Number(float, at_least=0),
        default=defaults.MAX_WAIT_MS,
        help=f"how long the first request of a batch may wait for others (default {defaults.MAX_WAIT_MS:g})",
    )
    p.add_argument(
        "--max-queue",
        type=COUNT,
        default=defaults.MAX_QUEUE,
        help=f"texts that may wait; beyond it requests get 429 with Retry-After (default {defaults.MAX_QUEUE})",
    )
    p.add_argument(
        "--max-batch-tokens",
        type=COUNT,
        default=defaults.MAX_BATCH_TOKENS,
        help="tokens per forward pass, counted with padding (texts times the longest); a longer request goes alone "
        "(default: no limit beyond --max-batch-size)",
    )
    p.add_argument(
        "--forward-overhead-tokens",
        type=_overhead,
        default=defaults.FORWARD_OVERHEAD_TOKENS,
        help="what one more forward pass costs, in padded tokens: a batch is cut into forwards by length where "
        "padding would cost more (auto: measured at start, a few dozen tokens on a CPU; off: every forward as full "
        f"as --max-batch-size and --max-batch-tokens allow; default {defaults.FORWARD_OVERHEAD_TOKENS})",
    )
    p.add_argument(
        "--model-process",
        action="store_true",
        default=defaults.MODEL_PROCESS,
        help="run the forwards in a process of their own beside the HTTP one (CPU models only): the event loop's "
        "Python then never holds up the model between torch operations, which matters most for short texts; costs "
        "a second process start (default: a thread of the server's process)",
    )
    p.add_argument(
        "--truncate",
        action="store_true",
        default=defaults.TRUNCATE,
        help="embed the first max_seq_length tokens of a longer input when a request does not say (default: refuse "
        'it with 400, as OpenAI does; a request\'s "truncate" field decides for itself)',
    )


def _context_options(p) -> None:  # an argument group of the parser
    p.add_argument(
        "--context-cache-mb",
        type=Number(float, at_least=0),
        default=defaults.CONTEXT_CACHE_MB,
        help="memory for the keys/values of contexts kept between switches, least recently used dropped first "
        f"(default {defaults.CONTEXT_CACHE_MB:g} MiB; 0: recompute them at every switch)",
    )
    p.add_argument(
        "--workers",
        type=COUNT,
        default=defaults.WORKERS,
        help=f"server processes on this port, sharing --state-dir (default {defaults.WORKERS}; each loads the model)",
    )
    p.add_argument("--listen-fd", type=FD, default=None, help=argparse.SUPPRESS)  # a --workers child's socket
    p.add_argument("--ready-fd", type=FD, default=None, help=argparse.SUPPRESS)  # a --workers child says "started"
    p.add_argument(
        "--context-refresh-s",
        type=Number(float, at_least=0),
        default=defaults.CONTEXT_REFRESH_S,
        help="how often a lookup checks the state directory for contexts other replicas wrote "
        f"(default {defaults.CONTEXT_REFRESH_S:g} s)",
    )


def _request_options(p) -> None:  # an argument group of the parser
    p.add_argument(
        "--max-inputs",
        type=COUNT,
        default=defaults.MAX_INPUTS,
        help=f"texts per request (default {defaults.MAX_INPUTS}, as OpenAI)",
    )
    p.add_argument(
        "--max-body-mb",
        type=Number(float, at_least=0.001),  # a limit under a KB would refuse every request (413)
        default=defaults.MAX_BODY_MB,
        help=f"request body limit in MiB (default {defaults.MAX_BODY_MB:g})",
    )
    p.add_argument(
        "--api-key-env",
        default=None,
        help="name of an environment variable holding the API key clients must send (default: no key)",
    )


def _connection_options(p) -> None:  # an argument group of the parser
    p.add_argument(
        "--max-connections",
        type=COUNT,
        default=defaults.MAX_CONNECTIONS,
        help="open connections and requests beyond which new ones get 503 at once "
        f"(default {defaults.MAX_CONNECTIONS})",
    )
    p.add_argument(
        "--max-connections-per-peer",
        type=COUNT,
        default=defaults.MAX_CONNECTIONS_PER_PEER,
        help="connections one client address may hold; past it its new ones are closed as they open, so one client "
        "cannot keep the others out (default: half of --max-connections; behind a proxy, whose connections all "
        "come from one address, give --max-connections)",
    )
    p.add_argument(
        "--head-timeout-s",
        type=Number(float, above=0),
        default=defaults.HEAD_TIMEOUT_S,
        help="time a connection has to send its request's head (request line and headers) after it opens or after "
        f"the previous answer; past it the connection is closed (default {defaults.HEAD_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--read-timeout-s",
        type=Number(float, above=0),
        default=defaults.READ_TIMEOUT_S,
        help="time a connection has to send a whole request (headers and body) after it opens or after the "
        f"previous answer; past it the connection is closed (default {defaults.READ_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--keep-alive-s",
        type=COUNT,
        default=defaults.KEEP_ALIVE_S,
        help=f"an idle connection is closed after this long (default {defaults.KEEP_ALIVE_S})",
    )
    p.add_argument(
        "--max-requests-per-connection",
        type=COUNT,
        default=defaults.MAX_REQUESTS_PER_CONNECTION,
        help="answers on one keep-alive connection; the last says 'Connection: close', so that a client's next "
        f"connection may go to another --workers process (default {defaults.MAX_REQUESTS_PER_CONNECTION}, as "
        "nginx's keepalive_requests)",
    )
    p.add_argument(
        "--max-connection-age-s",
        type=Number(float, above=0),
        default=defaults.MAX_CONNECTION_AGE_S,
        help="the first request on a connection open this long is answered with 'Connection: close', for the same "
        f"reason, for clients too slow to reach --max-requests-per-connection "
        f"(default {defaults.MAX_CONNECTION_AGE_S:g})",
    )
    p.add_argument(
        "--drain-timeout-s",
        type=Number(float, at_least=0),
        default=defaults.DRAIN_TIMEOUT_S,
        help="after SIGTERM, how long requests in flight may take to finish before the server exits anyway; new "
        f"requests get 503 meanwhile (default {defaults.DRAIN_TIMEOUT_S:g})",
    )


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        import fastapi  # noqa: F401 - the serve extra, checked before anything starts
        import uvicorn
    except ImportError as exc:
        _fail(f"cde-st-serve needs the serve extra: pip install 'cde_st[serve]' ({exc}).")
    from cde_st.serving.traffic import RequestIdFilter

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(RequestIdFilter())
    api_key = _checked_options(args)
    if args.workers != 1:  # the parent only starts and watches workers: it never imports the model's libraries
        status = _workers(args, sys.argv[1:] if argv is None else list(argv))
        if isinstance(status, str):
            _fail(status)
        sys.exit(status)
    from cde_st.serving.app import Settings, create_app
    from cde_st.serving.contexts import ContextStore
    from cde_st.serving.draining import DrainingServer

    engine = _engine(args)
    try:
        store = ContextStore(args.state_dir, engine.identity, refresh_seconds=args.context_refresh_s)
    except RuntimeError as exc:
        _fail(str(exc))
    if engine.model_context is not None:
        store.add_model_context(engine.model_context)
    if args.state_dir is None and engine.contextual:
        logger.warning("No --state-dir: contexts created through the API are lost when the server stops.")
    settings = Settings(
        api_key=api_key,
        max_batch_size=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        max_inputs=args.max_inputs,
        max_body_bytes=int(args.max_body_mb * defaults.MIB),
        max_batch_tokens=args.max_batch_tokens,
        truncate=args.truncate,
        forward_overhead_tokens=args.forward_overhead_tokens,
    )
    app = create_app(engine, store, settings)

    if args.listen_fd is None:
        sock = _listen(args.host, args.port)
    else:  # a --workers child
        from cde_st.serving.workers import stop_when_orphaned

        sock = socket.socket(fileno=args.listen_fd)
        stop_when_orphaned()
    port = sock.getsockname()[1]
    kind = "contextual" if engine.contextual else "plain (no contexts)"
    print(
        f"cde-st-serve: model {engine.served_name!r} ({kind}, identity {engine.identity}) listening on "
        f"http://{args.host}:{port}",
        flush=True,
    )
    _raise_open_files_limit(args.max_connections)
    config = _uvicorn_config(uvicorn, app, args)
    on_started = None if args.ready_fd is None else partial(_say_started, args.ready_fd)
    DrainingServer(config, app.state.traffic, args.drain_timeout_s, on_started=on_started).run(sockets=[sock])


def _uvicorn_config(uvicorn, app, args: argparse.Namespace):
    """uvicorn's configuration: logging through our handler, the bounds on connections (:mod:`~cde_st.serving.
    connections`)."""
    from cde_st.serving.connections import read_timeout_protocol

    return uvicorn.Config(
        app,
        log_level=args.log_level,
        log_config=None,  # uvicorn's loggers go through the handler above, request id included
        access_log=args.access_log,
        http=read_timeout_protocol(
            args.read_timeout_s,
            args.max_requests_per_connection,
            args.max_connection_age_s,
            head_timeout=args.head_timeout_s,
            max_per_peer=defaults.connections_per_peer(args.max_connections, args.max_connections_per_peer),
        ),
        limit_concurrency=args.max_connections,
        timeout_keep_alive=args.keep_alive_s,
        timeout_graceful_shutdown=10,
    )


def _fail(message: str) -> typing.NoReturn:
    """The commands' one error style (:mod:`cde_st.command_line`): ``error: ...`` on one line, exit status 2."""
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(2)


def _say_started(fd: int) -> None:
    """A ``--workers`` child tells its parent it serves (:func:`cde_st.serving.workers.run_workers`)."""
    os.write(fd, b"1")
    os.close(fd)


def _overhead(value: str) -> float | str | None:
    """``--forward-overhead-tokens``: "auto", "off" (None) or a number of tokens >= 0."""
    if value in ("auto", "off"):
        return None if value == "off" else value
    tokens = Number(float, at_least=0)
    try:
        return tokens(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected auto, off or {tokens.range()} tokens, got {value!r}") from None


def _checked_options(args: argparse.Namespace) -> str | None:
    """The API key (None: no key); exit naming the option when its variable is unset. The numbers were checked
    when parsed (:class:`~cde_st.command_line.Number`)."""
    if not args.api_key_env:
        return None
    api_key = os.environ.get(args.api_key_env)
    if not api_key:
        _fail(f"--api-key-env {args.api_key_env}: that environment variable is unset or empty.")
    return api_key


def _engine(args: argparse.Namespace):
    """The served model's engine; a model process it cannot start (off the CPU, no room in shared memory) exits
    naming the option, a model that does not load (no such folder, not on the hub or not cached offline, a released
    checkpoint's file missing) with the one-line error every command gives."""
    from cde_st.command_line import EXPECTED_ERRORS, report_error
    from cde_st.released import ReleasedCheckpointError
    from cde_st.serving.engine import Engine
    from cde_st.serving.model_process import ModelProcessFailed

    expected = (ReleasedCheckpointError, ImportError, *EXPECTED_ERRORS)  # a model or an export that does not load
    try:
        return Engine(
            args.model,
            device=args.device,
            dtype=args.dtype,
            backend=args.backend,
            onnx_file=args.onnx_file,
            served_name=args.served_model_name,
            max_batch_size=args.max_batch_size,
            max_batch_tokens=args.max_batch_tokens,
            context_cache_bytes=int(args.context_cache_mb * defaults.MIB),
            model_process=args.model_process,
        )
    except ModelProcessFailed as exc:
        _fail(f"--model-process: {exc}")
    except expected as exc:
        if args.model_process:
            _fail(f"--model-process: {exc}")
        sys.exit(report_error(exc, expected, {"MODEL": args.model}, how="give a local model folder as MODEL"))


def _raise_open_files_limit(connections: int) -> None:
    """Let the process hold ``connections`` sockets beside its files: raise the soft limit toward the hard one."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        if new < wanted:
            logger.warning("Open files are limited to %d: fewer than --max-connections %d allows.", new, connections)


def _workers(args: argparse.Namespace, argv: list[str]) -> int | str:
    """``--workers N``: bind the port and run N server processes on it (:mod:`cde_st.serving.workers`)."""
    if args.state_dir is None:
        return "--workers: more than one needs a --state-dir (the workers share its contexts)."
    from cde_st.serving.workers import run_workers

    sock = _listen(args.host, args.port)
    print(f"cde-st-serve: {args.workers} workers listening on http://{args.host}:{sock.getsockname()[1]}", flush=True)
    return run_workers(argv, args.workers, sock)


def _listen(host: str, port: int) -> socket.socket:
    """Bound here, not by uvicorn, so that with --port 0 the chosen port is known and printed before serving."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


if __name__ == "__main__":
    main()
