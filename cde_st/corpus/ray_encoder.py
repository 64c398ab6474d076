"""Embedding a shard's texts with Ray Data: ``map_batches`` over a pool of model actors, one per worker, on a local
machine or a Ray cluster (``pip install "cde_st[distributed]"``; ``ray.init()`` joins the cluster ``RAY_ADDRESS``
names, or starts a local one).

The model and the corpus context are put in Ray's object store once (``ray.put``); each actor reads both when it
starts and makes the vectors its active context, so every worker embeds with exactly the job's context and no worker
samples or embeds its own. The job (:func:`~cde_st.corpus.embed_corpus` with ``ray_workers=``) still cuts, writes,
checksums and records the shards, so resumption works as without Ray.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cde_st.corpus.encoders import document_prompt
from cde_st.model import is_contextual

__all__ = ["ModelActor", "RayEncoder"]


class ModelActor:
    """The callable class ``map_batches`` runs in each actor: the model and the context, read from the object store
    once, then ``{"row", "text"}`` batches in, ``{"row", "embedding"}`` out. The references come inside a list so
    that Ray hands them over as references (the actor fetches them itself)."""

    def __init__(self, refs: list, batch_size: int, normalize: bool) -> None:
        import ray

        torch.set_num_threads(max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1))))
        self.model, vectors = ray.get(refs[0]), ray.get(refs[1])
        self.model.eval()
        if vectors is not None:
            self.model.set_context(torch.as_tensor(vectors))
        self.prompt, self.batch_size, self.normalize = document_prompt(self.model), batch_size, normalize

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A block of ``{"shard", "row", "text"}`` -> ``{"shard", "row", "embedding"}``."""
        embeddings = self.model.encode_document(
            list(batch["text"]),
            prompt=self.prompt,
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=self.normalize,
            show_progress_bar=False,
        )
        return {"shard": batch["shard"], "row": batch["row"], "embedding": np.asarray(embeddings, dtype=np.float32)}


class RayEncoder:
    """A shard's texts -> embeddings through Ray Data, with ``workers`` model actors (the interface of
    :class:`~cde_st.corpus.encoders.DocumentEncoder`)."""

    def __init__(
        self, model: Any, context: np.ndarray | None, workers: int, batch_size: int = 32, normalize: bool = False
    ) -> None:
        try:
            import ray
        except ImportError as err:
            raise ImportError('Ray is not installed: pip install "cde_st[distributed]" (or "ray[data]").') from err
        if is_contextual(model) == (context is None):
            raise ValueError("a contextual model needs a context, and a plain model takes none.")
        if not ray.is_initialized():
            ray.init()
        self.ray, self.workers, self.batch_size, self.normalize = ray, workers, batch_size, normalize
        self.refs = [ray.put(model.to("cpu")), ray.put(context)]  # once: every actor reads these

    #: Shards per :meth:`encode_shards` call: each call starts the actors (they load the model) once.
    shards_per_call = 8

    def encode_shards(self, shards: list[list[str]]) -> list[np.ndarray]:
        """The embeddings of each shard's texts, in order. Each block holds at most ``4 * batch_size`` texts of one
        shard and is one ``encode_document`` call (``batch_size=None``: a block is a batch), so which texts share a
        padded batch depends on the shard only, not on which shards travel together."""
        import pyarrow as pa

        per_block = self.batch_size * 4
        blocks = [
            pa.table({"shard": [s] * len(texts[i : i + per_block]), "row": range(i, min(i + per_block, len(texts))),
                      "text": texts[i : i + per_block]})
            for s, texts in enumerate(shards)
            for i in range(0, len(texts), per_block)
        ]  # fmt: skip
        embedded = self.ray.data.from_arrow(blocks).map_batches(
            ModelActor,
            fn_constructor_args=(self.refs, self.batch_size, self.normalize),
            batch_size=None,
            batch_format="numpy",
            concurrency=min(self.workers, len(blocks)),
            num_cpus=1,
        )
        out: list[np.ndarray | None] = [None] * len(shards)
        for batch in embedded.iter_batches(batch_size=None, batch_format="numpy"):
            for s in np.unique(batch["shard"]):
                if out[s] is None:
                    out[s] = np.zeros((len(shards[s]), batch["embedding"].shape[1]), dtype=np.float32)
                mine = batch["shard"] == s
                out[s][batch["row"][mine]] = batch["embedding"][mine]
        return out

    def __call__(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dimension) float32 embeddings, in the order of ``texts``."""
        return self.encode_shards([texts])[0]

    def close(self) -> None:
        """Drop this job's references to the model and context (Ray frees them)."""
        self.refs = []

    def __enter__(self) -> RayEncoder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
