"""The active context of a :class:`~cde_st.modules.ContextualTransformer`: its lifecycle and its file.

The context is J first-stage vectors (``context_vectors``, (J', d) with J' <= J) plus what they came from. This
mixin is the one place they change (:meth:`ContextState._activate_context`): set from corpus texts (sampled,
prompted, embedded once) or given as vectors, snapshot and restored, cleared, re-embedded when the first-stage
weights change (a value fingerprint of those weights is kept beside the vectors), checked when given, padded to J
slots for the second stage, and saved beside the weights as ``context.safetensors``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from cde_st.context import (
    ContextInfo,
    check_seed,
    context_documents,
    fingerprint_array,
    fingerprint_texts,
    sample_context,
    sample_indices,
)
from cde_st.modules.caller import caller_stacklevel
from cde_st.modules.integrity import corrupt_file_error

logger = logging.getLogger(__name__)

CONTEXT_FILE = "context.safetensors"


@torch.no_grad()
def values_fingerprint(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """A fingerprint of the *values* of ``tensors``: the sum of every row (last dimension), concatenated, float32.

    One read of the values, so it sees every way a weight can change (optimizer steps, fused ones included, which
    do not bump version counters; ``param.data = ...``; in-place edits through ``.data``; ``load_state_dict``):
    any change of an element larger than the rounding of its row's sum, and any move of values between rows.
    Kept on the CPU, so fingerprints taken before and after ``model.to(device)`` compare. Compare with
    ``torch.equal``."""
    rows = [t.detach().flatten(0, -2) if t.ndim > 1 else t.detach().reshape(1, -1) for t in tensors]
    sums = [r.sum(-1, dtype=torch.float32) for r in rows]
    return torch.cat(sums).cpu() if sums else torch.zeros(0)


class ContextState:
    """The context lifecycle of :class:`~cde_st.modules.ContextualTransformer` (a mixin: it uses the module's
    first stage and context head, ``context_size``, ``hidden_size``, ``null_vector``, ``device``, the document prompt
    it reads through its model, and the second stage's key/value cache, dropped when the context changes)."""

    def _init_context_state(self) -> None:
        # The active context: (J', d2) first-stage vectors, J' <= context_size. Not a parameter and not in the
        # weights file (its size varies); saved beside it as context.safetensors.
        self.register_buffer("context_vectors", None, persistent=False)
        self.context_info: ContextInfo | None = None
        # Bumped in place whenever the active context changes; moved to shared memory when the module is pickled
        # (a multi-process pool's workers get such a copy), so a worker can tell that its copy went stale.
        self._context_generation = torch.zeros(1, dtype=torch.long)
        self._context_generation_seen = 0
        self._warned_null_context = False
        self._context_texts: list[str] | None = None  # the prompted documents of the active context, if texts
        # Fingerprint (values_fingerprint) of the first-stage weights the active context vectors were embedded with,
        # and the token ids of its documents (only their rows of the embedding table feed the vectors).
        self._context_weights: torch.Tensor | None = None
        self._context_token_ids: torch.Tensor | None = None
        self._weights_check_due = True  # set by eval() (once per encode call): compare fingerprints before use
        self._weights_key: tuple | None = None  # (parameters, their (storage, version)) at the last check
        # Depth of one_weights_check() scopes (an encode call): inside one, the batches after the first trust the
        # parameters' version counters; outside, every forward compares the weights' values.
        self._one_check_depth = 0
        self._warned_stale_context = False

    def __getstate__(self) -> dict:
        self._context_generation.share_memory_()  # in place: copies sent to other processes see later changes
        return super().__getstate__()

    # ------------------------------------------------------------------ setting the context
    def embed_context(
        self,
        corpus: Sequence[str],
        seed: int = 0,
        prompt: str | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
    ) -> tuple[torch.Tensor, ContextInfo]:
        """Sample J documents of ``corpus`` (seeded), prefix them, and embed them with the first stage."""
        vectors, info, _ = self._embed_corpus(corpus, seed, prompt, batch_size, show_progress_bar)
        return vectors, info

    def _embed_corpus(self, corpus, seed, prompt, batch_size, show_progress_bar):
        """:meth:`embed_context`, plus the sampled (prompted) documents, which set_context keeps."""
        corpus = context_documents(corpus)  # the corpus as a set of documents, the rule of every route
        prompt = self.document_prompt if prompt is None else prompt
        # Position-free context rows (ours) read a set; cde-small-v2's rotary context rows read an order.
        keep_order = self.prefix_positions == "sequence"
        sampled = [prompt + t for t in sample_context(corpus, self.context_size, seed, keep_order=keep_order)]
        vectors = self.embed_context_texts(sampled, batch_size=batch_size, show_progress_bar=show_progress_bar)
        info = ContextInfo(
            size=len(sampled),
            seed=seed,
            fingerprint=fingerprint_texts(sampled),
            source="texts",
            prompt=prompt,
            corpus_size=len(corpus),
        )
        return vectors, info, sampled

    def set_context(
        self,
        context: Sequence[str] | torch.Tensor | np.ndarray,
        seed: int = 0,
        prompt: str | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
    ) -> ContextInfo:
        """Make ``context`` the active context: corpus texts (sampled, prefixed, embedded once) or precomputed
        first-stage vectors of shape (n, hidden_size) with n <= context_size. Returns the :class:`ContextInfo`.

        The sample depends only on the corpus as a set of documents, ``context_size`` and ``seed`` (a non-negative
        int), not on the corpus order nor on repeats: a repeated document counts once, blank documents are dropped,
        a mapping (``{id: text}``) gives its texts (see :func:`cde_st.context.context_documents`; an architecture
        whose context rows carry positions, cde-small-v2, gets the chosen documents in corpus order). A numpy array of strings counts
        as texts; vectors that require grad are used detached. The context stays current: if the weights it was
        embedded with change (training, an optimizer step, ``load_state_dict``, ``param.data = ...``), the next
        encode or :meth:`save` re-embeds the same documents."""
        if context is None:
            raise TypeError(
                "set_context: context is None. Give corpus texts (a list of strings) or first-stage vectors of "
                f"shape (n, {self.hidden_size}); to remove the active context, call clear_context()."
            )
        if isinstance(context, np.ndarray) and context.dtype.kind in "USO":
            context = context.tolist()  # strings (or objects, checked as texts)
        if isinstance(context, (torch.Tensor, np.ndarray)):
            vectors = self.validate_context_vectors(context).detach()
            info = ContextInfo(
                size=len(vectors), seed=None, fingerprint=fingerprint_array(vectors.cpu().numpy()), source="vectors"
            )
            texts = None
        else:
            vectors, info, texts = self._embed_corpus(context, check_seed(seed), prompt, batch_size, show_progress_bar)
        self._activate_context(vectors, info, texts)
        return info

    def _activate_context(
        self,
        vectors: torch.Tensor | None,
        info: ContextInfo | None,
        texts: list[str] | None,
        weights: torch.Tensor | None = None,
    ):
        """The one place the active context changes (None: no context). ``texts``: the prompted documents the
        vectors were embedded from, kept to re-embed them if the first stage changes. ``weights``: the first-stage
        fingerprint the vectors belong to (None: the current weights, i.e. the vectors were just computed)."""
        self._drop_context_cache()
        if info is not self.context_info:  # a new context (re-embedding the same one after training is not)
            self._context_generation += 1
            self._context_generation_seen = int(self._context_generation)
        self.context_vectors = None if vectors is None else vectors.detach().to(self.device)
        self.context_info = info
        self._context_texts = texts
        self._context_token_ids = None
        if texts:
            ids = self.preprocess_context(texts)["input_ids"]
            self._context_token_ids = torch.unique(ids).to(self.device)
        if vectors is None:
            self._context_weights = None
        else:
            self._context_weights = self._first_stage_fingerprint() if weights is None else weights
        self._warned_stale_context = False

    def context_snapshot(self) -> tuple:
        """The active context as an opaque value for :meth:`restore_context` (to set a context temporarily). It
        remembers which first-stage weights the vectors came from, so restoring it after the weights changed
        re-embeds them at the next use instead of passing them off as current."""
        return self.context_vectors, self.context_info, self._context_texts, self._context_weights

    def restore_context(self, snapshot: tuple) -> None:
        """Make a :meth:`context_snapshot` the active context again."""
        vectors, info, texts, weights = snapshot
        self._activate_context(vectors, info, texts, weights=weights)

    # ------------------------------------------------------------------ keeping the context fresh
    @torch.no_grad()
    def _first_stage_fingerprint(self) -> torch.Tensor:
        """:func:`values_fingerprint` of what the active context vectors are computed from: the first stage and
        the context head, of the input-embedding table only the rows of the context's tokens (all rows for vectors
        given directly). One read of those weights (MiniLM, 64 documents: ~12M values)."""
        table = self.first_stage.get_input_embeddings().weight
        tensors = [p for p in self.first_stage.parameters() if p is not table]
        tensors += list(self.context_head.parameters())
        ids = self._context_token_ids
        tensors.append(table if ids is None else table[ids.to(table.device)])
        return values_fingerprint(tensors)

    @contextmanager
    def one_weights_check(self) -> Iterator[None]:
        """Within the block (one encode call: :meth:`ContextualSentenceTransformer.encode` opens it), the weights are
        compared with those of the active context and its cached keys/values once, at the first forward; the later
        batches only look at the parameters' version counters (nothing can change the weights between the batches
        of one call). Outside such a block every inference forward that uses the active context compares the
        weights' values (a few ms for MiniLM), because a change no version counter records (a fused optimizer step,
        an edit through ``param.data``) may have happened between two direct forward calls."""
        self._one_check_depth += 1
        self._weights_check_due = True
        try:
            yield
        finally:
            self._one_check_depth -= 1

    def _check_weights(self) -> None:
        """Before an inference forward uses the active context or the cached keys/values: compare the fingerprints
        of the weights they came from with the current ones (re-embed the context, drop the cache where they
        differ). Inside :meth:`one_weights_check` (an encode call) only the first forward does, and later ones
        again if a parameter's storage or version counter moved; every other forward does."""
        if self._one_check_depth > 0 and not self._weights_check_due and self._weights_key is not None:
            params, key = self._weights_key
            if key == tuple((p.data_ptr(), p._version) for p in params):
                return
        self.refresh_context()
        self._drop_stale_context_cache()
        params = list(self.parameters())  # listed once per check: walking the module tree per batch costs ~1 ms
        self._weights_key = (params, tuple((p.data_ptr(), p._version) for p in params))
        self._weights_check_due = False

    def refresh_context(self) -> bool:
        """Recompute the active context if the first stage changed since it was set (e.g. by training).

        The check compares a fingerprint of the weights' values (:func:`values_fingerprint`), so any way of
        changing them counts: optimizer steps (fused ones too), ``param.data = ...``, in-place edits,
        ``load_state_dict``. A context set from texts is re-embedded from the same sampled documents (its
        fingerprint stays the same); vectors given directly cannot be recomputed, and a warning says so once.
        Called before the first batch of every encode that uses the active context and by :meth:`save`, so a
        stale context is never used or written. Returns whether the context was recomputed."""
        if self.context_vectors is None or self._context_weights is None:
            return False
        if torch.equal(self._first_stage_fingerprint(), self._context_weights):
            return False

        if self._context_texts is None:
            if not self._warned_stale_context:
                warnings.warn(
                    "The first stage changed since the context vectors were set (given as vectors, so they cannot be "
                    "recomputed): they may be stale. Call set_context(corpus_texts) again.",
                    UserWarning,
                    stacklevel=caller_stacklevel(),
                )
                self._warned_stale_context = True
            return False
        logger.info(
            "The first stage changed since set_context: re-embedding the %d context documents.",
            len(self._context_texts),
        )
        self._activate_context(self.embed_context_texts(self._context_texts), self.context_info, self._context_texts)
        return True

    def embedding_fingerprint(self) -> str:
        """A short hash of everything this module's embeddings depend on besides the input: the active context (its
        vectors, made current first; "none" without one), the values of every weight and the config. Anything that
        caches embeddings of a contextual model keys them by it, so that a cache made with another context (or
        other weights) is never read back (:func:`cde_st.hard_negatives.mine_hard_negatives`)."""
        self.refresh_context()
        digest = hashlib.sha256()
        if self.context_vectors is None:
            digest.update(b"no context")
        else:
            vectors = self.context_vectors.detach().float().cpu().contiguous()
            digest.update(str(tuple(vectors.shape)).encode() + vectors.numpy().tobytes())
        digest.update(values_fingerprint(list(self.parameters())).numpy().tobytes())
        digest.update(json.dumps(self.config.to_dict(), sort_keys=True, default=str).encode())
        return digest.hexdigest()[:16]

    def _check_pool_context(self) -> None:
        """In a copy made for another process (a multi-process pool's worker): raise if the original's context
        changed since the copy was made, instead of encoding with the stale one."""
        if int(self._context_generation) != self._context_generation_seen:
            raise RuntimeError(
                "The context of this model changed after its multi-process pool was started, and the pool's workers "
                "still hold the old one. Start the pool after set_context (model.stop_multi_process_pool(pool); "
                "pool = model.start_multi_process_pool(...)), pass the context as context_vectors=, or load the "
                "model with cde_st.ContextualSentenceTransformer(path), whose pools always get the current context."
            )

    def clear_context(self) -> None:
        """Forget the active context: encoding falls back to the null context (with a warning)."""
        self._activate_context(None, None, None)
        self._warned_null_context = False

    def validate_context_vectors(self, vectors: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Check precomputed first-stage vectors: 2-D, width hidden_size, at most context_size rows, finite."""
        if isinstance(vectors, np.ndarray):
            vectors = torch.from_numpy(vectors)
        if not isinstance(vectors, torch.Tensor):
            raise TypeError(f"Context vectors must be a torch.Tensor or numpy array, got {type(vectors).__name__}.")
        if vectors.ndim != 2 or vectors.shape[1] != self.hidden_size:
            raise ValueError(
                f"Context vectors must have shape (n, {self.hidden_size}) (first-stage output width); "
                f"got {tuple(vectors.shape)}."
            )
        if vectors.shape[0] > self.context_size:
            raise ValueError(
                f"Got {vectors.shape[0]} context vectors but the model has context_size={self.context_size}; "
                "sample at most that many documents (set_context(texts) samples for you)."
            )
        if not torch.isfinite(vectors.detach()).all():
            raise ValueError("Context vectors contain NaN or infinite values.")
        # float32 at least (half-precision vectors are widened); float64 stays float64 so a float64 model is not
        # rounded through float32. Differentiable: vectors that require grad (training) keep their gradient path.
        return vectors if vectors.dtype == torch.float64 else vectors.float()

    def warn_null_context(self, stacklevel: int | None = None) -> None:
        """Warn (once until a context is set) that encoding uses the null context."""
        if self.context_size > 0 and not self._warned_null_context:
            warnings.warn(
                "No context is set: encoding with the null context (the model then acts as a plain bi-encoder). "
                "Call model.set_context(corpus_texts) first, or pass context_vectors=.",
                UserWarning,
                stacklevel=caller_stacklevel() if stacklevel is None else stacklevel,
            )
            self._warned_null_context = True

    def _context_slots(self, given: torch.Tensor | np.ndarray | None, dtype) -> torch.Tensor:
        """The (J, d2) context the second stage sees: the ``given`` context vectors (one forward's) or the active
        ones, null-padded (or tiled), with sequence dropout while training."""
        if given is None and not self.training:
            self._check_weights()
        if given is None:
            self._check_pool_context()
        if given is not None:
            # Checked whether or not they require grad: NaN or too many rows must fail in training as well.
            vectors = self.validate_context_vectors(given).to(device=self.device, dtype=dtype)
        elif self.context_vectors is not None:
            vectors = self.context_vectors.to(dtype)
            if vectors.is_inference() and not torch.is_inference_mode_enabled():
                vectors = vectors.clone()  # embedded under inference mode; autograd may need to save them
        else:
            if not self.training:
                self.warn_null_context()
            vectors = self.null_vector.new_zeros(0, self.hidden_size).to(dtype)
        n_missing = self.context_size - vectors.shape[0]
        if n_missing > 0 and self.context_padding == "tile" and len(vectors):
            vectors = vectors[self._tile_index(len(vectors))]
        elif n_missing > 0:
            vectors = torch.cat([vectors, self.null_vector.to(dtype).expand(n_missing, -1)])
        if self.training and self.sequence_dropout > 0 and self.context_size > 0:
            drop = torch.rand(vectors.shape[0], device=vectors.device) < self.sequence_dropout
            vectors = torch.where(drop.unsqueeze(-1), self.null_vector.to(dtype).expand_as(vectors), vectors)
        return vectors

    def _tile_index(self, n: int) -> torch.Tensor:
        """Which of n given vectors fills each of the J slots under ``context_padding="tile"``: the same even
        repetition set_context uses for a small corpus."""
        return torch.as_tensor(sample_indices(n, self.context_size, seed=0), device=self.device)

    # ------------------------------------------------------------------ context.safetensors
    def save_context(self, output_path: str) -> None:
        """Write the active context (refreshed first: never vectors of an older first stage) with the documents it
        was sampled from to ``output_path/context.safetensors``; without a context, remove a stale file."""
        context_path = os.path.join(output_path, CONTEXT_FILE)
        if self.context_vectors is not None:
            self.refresh_context()
            # the sampled documents go with the vectors, so a loaded model can re-embed them after more training
            metadata = {"texts": json.dumps(self._context_texts)} if self._context_texts is not None else None
            save_file(
                {"vectors": self.context_vectors.detach().float().cpu().contiguous()}, context_path, metadata=metadata
            )
        elif os.path.exists(context_path):
            os.remove(context_path)

    def load_context(self, context_path: str, exists: bool, context_info: dict | None, config_path: str) -> None:
        """Restore the saved context: ``context.safetensors`` must agree with the ``context_info`` that
        ``cde_config.json`` records, and passes the checks of :meth:`validate_context_vectors`."""
        if context_info is None:
            if exists:
                warnings.warn(
                    f"{context_path} is ignored: {config_path} records no context (context_info is null). "
                    "The model loads with no context; call set_context(...) or delete the stray file.",
                    UserWarning,
                    stacklevel=caller_stacklevel(),
                )
            return
        try:
            info = ContextInfo(**context_info)
        except TypeError as exc:
            raise ValueError(f"{config_path}: context_info={context_info!r} is invalid ({exc}).") from None
        if not exists:
            raise FileNotFoundError(
                f"{context_path} is missing, but {config_path} records a context (context_info={context_info}). "
                f"Restore {CONTEXT_FILE} from where the model was saved, or set context_info to null in "
                f"{os.path.basename(config_path)} to load the model without a context."
            )
        try:
            with safe_open(context_path, framework="pt") as f:
                tensors = {key: f.get_tensor(key) for key in f.keys()}
                texts = (f.metadata() or {}).get("texts")  # the sampled documents, when set from texts
        except SafetensorError as exc:
            raise corrupt_file_error(context_path, exc) from None
        if "vectors" not in tensors:
            raise ValueError(f"{context_path} has no 'vectors' tensor (it holds {sorted(tensors)}).")
        try:
            vectors = self.validate_context_vectors(tensors["vectors"])
        except ValueError as exc:
            raise ValueError(f"{context_path}: {exc}") from None
        if len(vectors) != info.size:
            raise ValueError(
                f"{context_path} holds {len(vectors)} context vectors, but {config_path} records "
                f"context_info.size={info.size}: the two files do not belong together."
            )
        self._activate_context(vectors, info, json.loads(texts) if texts else None)
