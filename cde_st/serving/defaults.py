"""The defaults of ``cde-st-serve``, in one place: the command's options (and their help texts), and the classes
that run without the command (:class:`~cde_st.serving.app.Settings`, :class:`~cde_st.serving.batching.DynamicBatcher`,
:class:`~cde_st.serving.engine.Engine`, :class:`~cde_st.serving.contexts.ContextStore`,
:class:`~cde_st.serving.draining.DrainingServer`) all read them from here, so a server started by a script behaves
as one started from the command line.

Plain values (and the rule for the per-peer limit), nothing imported: the ``--workers`` parent and ``--help`` read them without loading torch.
"""

from __future__ import annotations

__all__ = [
    "ACCESS_LOG",
    "BACKEND",
    "CONTEXT_BATCH_SIZE",
    "CONTEXT_CACHE_BYTES",
    "CONTEXT_CACHE_MB",
    "CONTEXT_REFRESH_S",
    "DRAIN_TIMEOUT_S",
    "DTYPE",
    "FORWARD_OVERHEAD_TOKENS",
    "HEAD_TIMEOUT_S",
    "HOST",
    "KEEP_ALIVE_S",
    "LOG_LEVEL",
    "MAX_BATCH_SIZE",
    "MAX_BATCH_TOKENS",
    "MAX_BODY_BYTES",
    "MAX_BODY_MB",
    "MAX_CONNECTIONS",
    "MAX_CONNECTIONS_PER_PEER",
    "MAX_CONNECTION_AGE_S",
    "MAX_INPUTS",
    "MAX_QUEUE",
    "MAX_REQUESTS_PER_CONNECTION",
    "MAX_WAIT_MS",
    "MIB",
    "MODEL_PROCESS",
    "PORT",
    "READ_TIMEOUT_S",
    "TRUNCATE",
    "WORKERS",
    "connections_per_peer",
]

MIB = 1024 * 1024

# ---------------------------------------------------------------------- where and what
#: This machine only, until asked otherwise.
HOST = "127.0.0.1"
PORT = 8000
BACKEND = "torch"
#: The torch dtype the model is cast to after loading ("float32": no cast).
DTYPE = "float32"
LOG_LEVEL = "info"
#: Every request in the log: off, as it costs throughput.
ACCESS_LOG = False

# ---------------------------------------------------------------------- batching
#: Texts per forward pass.
MAX_BATCH_SIZE = 32
#: How long the first request of a batch may wait for others, in milliseconds.
MAX_WAIT_MS = 5.0
#: Texts that may wait; beyond it requests get 429.
MAX_QUEUE = 1024
#: Tokens per forward pass, counted with padding (None: no limit beyond MAX_BATCH_SIZE).
MAX_BATCH_TOKENS: int | None = None
#: What one more forward costs in padded tokens: "auto" measures it at warm-up; None keeps forwards full.
FORWARD_OVERHEAD_TOKENS: float | str | None = "auto"
#: Forwards in a thread of the server's process; True: in a process of their own (CPU models).
MODEL_PROCESS = False
#: What a request that does not say gets: False refuses an input longer than the model reads (400), as OpenAI does.
TRUNCATE = False

# ---------------------------------------------------------------------- contexts and replicas
#: Memory for the keys/values of contexts kept between switches (cached attention).
CONTEXT_CACHE_MB = 256.0
CONTEXT_CACHE_BYTES = int(CONTEXT_CACHE_MB * MIB)
#: First-stage documents per batch of a context creation: small, so an embedding waits little behind one batch (a
#: batch of 8 long documents took over a second on a busy 2-core machine, against 0.4 s for a query's p99).
CONTEXT_BATCH_SIZE = 2
#: How often a lookup checks the state directory for contexts other replicas wrote, in seconds.
CONTEXT_REFRESH_S = 0.5
#: Server processes on one port.
WORKERS = 1

# ---------------------------------------------------------------------- requests and connections
#: Texts per request (OpenAI's limit).
MAX_INPUTS = 2048
MAX_BODY_MB = 32.0
MAX_BODY_BYTES = int(MAX_BODY_MB * MIB)
#: Open connections and requests beyond which new ones get 503 at once.
MAX_CONNECTIONS = 1000
#: Connections one client address may hold (None: half of MAX_CONNECTIONS), so one client cannot keep all others out.
MAX_CONNECTIONS_PER_PEER: int | None = None
#: Time a connection has to send a whole request after it opens or after the previous answer, in seconds.
READ_TIMEOUT_S = 30.0
#: Time it has to send the request's head (request line and headers), in seconds: an idle socket frees its slot soon.
HEAD_TIMEOUT_S = 5.0
#: An idle connection is closed after this many seconds.
KEEP_ALIVE_S = 5
#: Answers on one keep-alive connection (nginx's keepalive_requests), so clients spread over --workers processes.
MAX_REQUESTS_PER_CONNECTION = 1000
#: Age in seconds after which a connection's next answer closes it, for clients too slow to reach the count above.
MAX_CONNECTION_AGE_S = 60.0
#: After SIGTERM, how long requests in flight may take to finish, in seconds.
DRAIN_TIMEOUT_S = 30.0


def connections_per_peer(max_connections: int, given: int | None = MAX_CONNECTIONS_PER_PEER) -> int:
    """The connections one client address may hold: ``given``, or half of ``max_connections`` (at least one)."""
    return given if given is not None else max(1, max_connections // 2)
