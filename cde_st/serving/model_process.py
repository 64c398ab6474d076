"""The model's forwards in a process of their own, beside the HTTP process.

In one process the event loop (HTTP parsing, routing, JSON, tokenising) and the model's thread share one
interpreter lock: every time a torch operation returns, the model's thread waits for the lock while the loop runs
Python. With short texts a forward is hundreds of small operations, and on two cores this costs a third of the
forward's speed (a thread busy 40% of the time slowed the forward of 16 queries from about 120 to 80 texts/s; a
process as busy, to about 100-120). :class:`ModelProcess` runs the forwards in a child process with its own
interpreter: the server's process tokenises, batches and answers; the child pads, runs the forward and keeps the
contexts' keys/values.

The child is spawned (a forked child would inherit CUDA and thread-pool state it cannot use); the model reaches it
through ``torch.multiprocessing``, so its weights live in shared memory once for both processes, not twice.
Messages after that are plain pickles of NumPy arrays (no shared-memory file per tensor). A context's vectors
cross once, the first time a batch uses it; when the server lets the context go (deleted, replaced), the child
is told with the next batch and frees its keys/values.

If the child dies (killed, out of memory, while loading or later), the batch in flight fails with
:class:`ModelProcessFailed` and a new child is started: by the next batch, or sooner by the server's readiness watch
(:mod:`cde_st.serving.readiness`), which calls :meth:`ModelProcess.ensure_ready` between batches. A new child rather
than 503 for good: the weights are in shared memory already, so a restart takes the seconds of a child's start, and
the server's ``/ready`` answers 503 meanwhile (:attr:`ModelProcess.ready`), so a load balancer routes elsewhere.
"""

from __future__ import annotations

import logging
import multiprocessing.connection
import pickle
import signal
import threading
import weakref
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from cde_st.context_errors import ContextError
from cde_st.serving.batching import Unavailable
from cde_st.serving.context_cache import CacheStats
from cde_st.serving.forwards import Forwards

__all__ = ["START_TIMEOUT", "STOP_TIMEOUT", "ModelProcess", "ModelProcessFailed"]

logger = logging.getLogger(__name__)

#: Seconds to wait for the child to load the model and answer that it is ready.
START_TIMEOUT = 600.0
#: Seconds a stopping child gets before it is killed.
STOP_TIMEOUT = 10.0


class ModelProcessFailed(Unavailable):
    """The model's process died or could not start; the request may be retried (a new process is started, so the
    server answers 503 with Retry-After)."""


@dataclass
class _Reply:
    batch: Any  # a Forwards' Batch
    forwards: int  # forwards this batch took
    cache: CacheStats


class ModelProcess:
    """Forwards of ``model`` in a child process, which builds ``Forwards(model, **settings)`` (:class:`~cde_st.
    serving.forwards.Forwards`: batch limits, context cache budget) and nothing else of the server: no tokenizer
    copies, no threads. :meth:`embed` is called from one thread at a time (the server's model thread);
    :meth:`close` ends the child."""

    def __init__(self, model: torch.nn.Module, settings: dict) -> None:
        self.model, self.settings = model, dict(settings)
        self._serials: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # context -> its number
        self._sent: set[int] = set()  # contexts the running child holds
        self._forgotten: deque[int] = deque()  # contexts let go since the last message
        self._next_serial = 0
        self._conn = self._process = None
        self._ready = False  # the running child answered that it is ready
        self._lock = threading.Lock()
        self.starts = 0
        self.cache = CacheStats(0, 0, 0, int(self.settings.get("context_cache_bytes", 0)))

    # ------------------------------------------------------------------ the child's life
    def start(self) -> None:
        """Spawn the child (it loads in the background; :meth:`embed` waits for it)."""
        context = torch.multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        process = context.Process(
            target=_serve, args=(child, self.model, self.settings), name="cde-st-model", daemon=True
        )
        try:
            process.start()  # the weights move to shared memory here
        except (OSError, RuntimeError) as exc:
            parent.close()
            raise ModelProcessFailed(
                f"The model's process could not start ({type(exc).__name__}: {exc}). Its weights go to shared memory "
                "(/dev/shm): in a container, give it room for the model (docker run --shm-size)."
            ) from exc
        finally:
            child.close()
        self._conn, self._process, self._ready = parent, process, False
        self._sent.clear()
        self.starts += 1

    def _wait_ready(self) -> None:
        if not self._conn.poll(START_TIMEOUT):
            self._stop(kill=True)
            raise ModelProcessFailed(f"The model's process did not start within {START_TIMEOUT:.0f} s.")
        status, detail = self._receive()
        if status != "ready":
            self._stop(kill=True)
            raise ModelProcessFailed(f"The model's process could not start: {detail}")
        self._ready = True

    @property
    def ready(self) -> bool:
        """Whether a child is running and has answered that it is ready (False while it loads, and once it ended)."""
        return self._ready and self.running

    def ensure_ready(self) -> None:
        """Start a new child if none runs (the last one ended) and wait until it is ready; call it where forwards
        run (the server's model thread). :class:`ModelProcessFailed` if the child cannot start or dies loading."""
        with self._lock:
            try:
                self._ensure_ready()
            except (EOFError, OSError) as exc:
                raise self._ended(exc) from exc

    def _ensure_ready(self) -> None:
        if self._process is not None and not self.running:  # died since the last batch (or while loading)
            logger.warning("The model's process ended (exit code %s); starting a new one.", self._process.exitcode)
            self._stop(kill=True)
        if self._process is None:
            self.start()
        if not self._ready:
            self._wait_ready()

    def _ended(self, exc: BaseException) -> ModelProcessFailed:
        """The error for a child that ended under a call (its pipe closed), once it is reaped."""
        code = None
        if self._process is not None:
            self._process.join(STOP_TIMEOUT)  # its exit code, for the message
            code = self._process.exitcode
        self._stop(kill=True)
        return ModelProcessFailed(f"The model's process ended (exit code {code}); retry: a new one starts.")

    @property
    def running(self) -> bool:
        """Whether a child was started and has not ended (read from its sentinel, not ``is_alive()``, whose
        waitpid cannot tell once something else in the process reaped the child)."""
        process = self._process
        return process is not None and not multiprocessing.connection.wait([process.sentinel], 0)

    @property
    def pid(self) -> int | None:
        """The running child's process id (None before the first start or after a failure)."""
        return None if self._process is None else self._process.pid

    def close(self) -> None:
        """End the child: it finishes the forward in progress, then exits (killed after ``STOP_TIMEOUT`` s)."""
        with self._lock:
            self._stop(kill=False)

    def _stop(self, kill: bool) -> None:
        conn, process, self._conn, self._process = self._conn, self._process, None, None
        if conn is not None:
            try:
                if not kill:
                    conn.send_bytes(pickle.dumps(None))
            except OSError:
                pass
            conn.close()
        if process is not None:
            process.join(0 if kill else STOP_TIMEOUT)
            if process.is_alive():
                process.kill()
                process.join()

    # ------------------------------------------------------------------ forwards
    def embed(self, parts: list, context, overhead_tokens: float | None):
        """The child's ``Forwards.embed_tokens(parts, context)`` with ``overhead_tokens`` as its forward cost: (the
        batch, the forwards it took); :attr:`cache` is updated. Errors the forward raises are raised here;
        :class:`ModelProcessFailed` when the child died (the next call starts another)."""
        with self._lock:
            try:
                self._ensure_ready()
                self._conn.send_bytes(pickle.dumps(self._message(parts, context, overhead_tokens), protocol=5))
                status, detail = self._receive()
            except (EOFError, OSError) as exc:
                raise self._ended(exc) from exc
        if status == "error":
            raise detail
        self.cache = detail.cache
        return detail.batch, detail.forwards

    def _message(self, parts: list, context, overhead_tokens: float | None) -> tuple:
        forget = []
        while self._forgotten:
            serial = self._forgotten.popleft()
            if serial in self._sent:
                self._sent.discard(serial)
                forget.append(serial)
        serial, vectors = None, None
        if context is not None:
            serial = self._serials.get(context)
            if serial is None:
                serial = self._next_serial = self._next_serial + 1
                self._serials[context] = serial
                weakref.finalize(context, self._forgotten.append, serial)
            if serial not in self._sent:
                vectors = replace(context, vectors=context.vectors.numpy())
                self._sent.add(serial)
        return forget, serial, vectors, [_to_numpy(part) for part in parts], overhead_tokens

    def _receive(self) -> tuple:
        message = self._conn.recv_bytes()
        return pickle.loads(message)


def _to_numpy(part):
    """A request's tokens with NumPy features (a pickle of a tensor goes through torch.save: slower)."""
    if part.features is None:
        return part
    return replace(part, features={k: v.numpy() if torch.is_tensor(v) else v for k, v in part.features.items()})


def _to_torch(part):
    if part.features is None:
        return part
    features = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in part.features.items()}
    return replace(part, features=features)


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` if it survives a pickle round trip, else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _serve(conn, model: torch.nn.Module, settings: dict) -> None:
    """The child: build the forwards on the shared model, answer ready, then run one forward per message until the
    parent sends None or goes away."""
    # Ctrl-C reaches the whole foreground process group: the server's process decides when this one ends (it
    # closes the pipe), so a stop is not a traceback here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forwards = Forwards(model, **settings)
    except Exception as exc:
        conn.send_bytes(pickle.dumps(("failed", f"{type(exc).__name__}: {exc}")))
        return
    conn.send_bytes(pickle.dumps(("ready", None)))
    contexts: dict[int, Any] = {}
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return  # the server's process went away
        if message is None:
            return
        forget, serial, stored, parts, overhead_tokens = message
        for number in forget:
            contexts.pop(number, None)  # its keys/values go with it (the forwards keep them by weak reference)
        if stored is not None:
            contexts[serial] = replace(stored, vectors=torch.from_numpy(stored.vectors))
        forwards.forward_overhead_tokens = overhead_tokens
        before = forwards.forwards
        try:
            batch = forwards.embed_tokens([_to_torch(part) for part in parts], contexts.get(serial))
            reply = ("ok", _Reply(batch, forwards.forwards - before, forwards.cache_stats()))
        except Exception as exc:
            if not isinstance(exc, ContextError):  # a fault, not a refusal: its traceback is only here
                logger.exception("A forward failed in the model process.")
            reply = ("error", _picklable(exc))
        conn.send_bytes(pickle.dumps(reply, protocol=5))
