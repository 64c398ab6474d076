"""Turning a shard's texts into embeddings: in this process, or on several devices through sentence-transformers'
multi-process pool (one process per device: ``["cuda:0", "cuda:1"]`` or ``["cpu", "cpu"]``).

Both carry the corpus context as vectors. In process, the context is made active once (``set_context(vectors)``,
so a cached-context model computes its keys/values once). With a pool, ``ContextualSentenceTransformer`` hands the
active context's vectors to the workers with every call (their copy of the model was made when the pool started),
so each worker reads exactly these vectors.
"""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from cde_st.model import is_contextual

__all__ = ["DOCUMENT_PROMPT_NAMES", "DocumentEncoder", "WorkerPool", "document_prompt"]

#: The prompt names sentence-transformers' ``encode_document`` looks for, in its order.
DOCUMENT_PROMPT_NAMES = ("document", "passage", "corpus")


def document_prompt(model: Any) -> str:
    """The prompt ``encode_document`` applies: the model's first of ``document`` / ``passage`` / ``corpus``
    prompts, else its default prompt, else none (``""``)."""
    prompts = getattr(model, "prompts", None) or {}
    for name in DOCUMENT_PROMPT_NAMES:
        if name in prompts:
            return prompts[name]
    default = getattr(model, "default_prompt_name", None)
    return prompts.get(default, "") if default else ""


class WorkerPool:
    """sentence-transformers' multi-process pool on ``devices`` (none for fewer than two devices), started in the
    background; a context manager that stops it.

    A worker takes seconds to start (it imports torch and unpickles the model), and sentence-transformers' start
    returns only once each worker has read the model, one after the other. A job starts its pool as soon as it knows
    it will embed, from a copy of the model and in a thread, so that this process scans the corpus and embeds the
    context with the model meanwhile; :attr:`pool` waits for the start. The workers' copy is the model as it was
    when the pool was made (they get the context with every call); the model itself is not moved.
    """

    def __init__(self, model: Any, devices: list[str] | None) -> None:
        self.model, self._pool, self._starting = model, None, None
        if devices is not None and len(devices) > 1:
            snapshot = copy.deepcopy(model)  # the thread reads it while this process runs the model
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cde-st-pool-start")
            self._starting = self._executor.submit(snapshot.start_multi_process_pool, list(devices))

    @property
    def pool(self) -> dict | None:
        """sentence-transformers' pool (None without one), once its workers have started."""
        if self._starting is not None:
            starting, self._starting = self._starting, None
            self._executor.shutdown()
            self._pool = starting.result()  # a failed start raises here
        return self._pool

    def close(self) -> None:
        """Stop the workers (waiting for their start first, if it is still under way)."""
        try:
            pool = self.pool
        finally:
            self._pool = None
        if pool is not None:
            self.model.stop_multi_process_pool(pool)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DocumentEncoder:
    """Embeds documents as ``model.encode_document`` does, with ``context`` (J, d) vectors (None for a plain
    model), in this process (``devices`` None or one device) or in a multi-process pool (several devices; or
    ``pool``, a started :class:`WorkerPool` the caller stops).

    Use as a context manager (the pool is stopped on exit)::

        with DocumentEncoder(model, vectors, devices=["cpu", "cpu"]) as encoder:
            embeddings = encoder(texts)  # (n, dimension) float32
    """

    def __init__(
        self,
        model: Any,
        context: np.ndarray | None,
        devices: list[str] | None = None,
        batch_size: int = 32,
        normalize: bool = False,
        pool: WorkerPool | None = None,
    ) -> None:
        self.model, self.batch_size, self.normalize = model, batch_size, normalize
        self.prompt = document_prompt(model)
        self._snapshot = None
        if is_contextual(model):
            if context is None:
                raise ValueError("a contextual model needs a context to embed a corpus with.")
            self._snapshot = model.contextual_module.context_snapshot()  # the caller's context, put back by close()
            model.set_context(torch.as_tensor(context, dtype=torch.float32))
        elif context is not None:
            raise ValueError(f"{type(model).__name__} is not a contextual model; it takes no context.")
        self._own_pool = None
        if pool is None or pool.pool is None:
            pool = self._own_pool = WorkerPool(model, devices)
            if pool.pool is None and devices:
                model.to(devices[0])
        self.pool = pool.pool

    #: Shards embedded per :meth:`encode_shards` call: one (each shard is one ``encode_document`` call, so which
    #: texts share a padded batch depends on that shard only, and a resumed job embeds exactly as a whole one).
    shards_per_call = 1

    def encode_shards(self, shards: list[list[str]]) -> list[np.ndarray]:
        """The embeddings of each shard's texts."""
        return [self(texts) for texts in shards]

    def __call__(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dimension) float32 embeddings."""
        kwargs: dict[str, Any] = {"batch_size": self.batch_size, "show_progress_bar": False}
        if self.pool is not None:
            # Fixed-size chunks: which texts share a padded batch is then the same in every run (resume is exact).
            kwargs.update(pool=self.pool, chunk_size=self.batch_size * 4)
        embeddings = self.model.encode_document(
            texts, prompt=self.prompt, convert_to_numpy=True, normalize_embeddings=self.normalize, **kwargs
        )
        return np.asarray(embeddings, dtype=np.float32)

    def close(self) -> None:
        """Stop the pool this encoder started (if any) and make the model's own context active again."""
        if self._own_pool is not None:
            self._own_pool.close()
            self._own_pool = None
        self.pool = None
        if self._snapshot is not None:
            self.model.contextual_module.restore_context(self._snapshot)
            self._snapshot = None

    def __enter__(self) -> DocumentEncoder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
