"""The active context of a :class:`~cde_st.modules.ContextualTransformer`: one object, :class:`ActiveContext`.

The context is J first-stage vectors (``vectors``, (J', d) with J' <= J) plus what they came from: their
:class:`~cde_st.context.ContextInfo`, the prompted documents they were embedded from (when set from texts), those
documents' token ids, and a value fingerprint of the first-stage weights they were embedded with. The module owns
one :class:`ActiveContext` and is the only caller of :meth:`ActiveContext.replace`, the one place the context
changes; everything this object needs from the module (the current first-stage fingerprint, the device) is an
argument. The context is saved beside the weights as ``context.safetensors`` (:meth:`ActiveContext.save`,
:func:`read_context_file`).

Example:
    >>> context = ActiveContext()
    >>> context.replace(torch.zeros(2, 4), info, None, None, fingerprint, "cpu")  # doctest: +SKIP
    >>> context.vectors.shape                                                   # doctest: +SKIP
    torch.Size([2, 4])
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from cde_st.atomic_files import write_path_atomically
from cde_st.context import ContextInfo
from cde_st.modules.integrity import check_readable, corrupt_file_error
from cde_st.modules.warning_location import caller_stacklevel

CONTEXT_FILE = "context.safetensors"


def validate_context_vectors(vectors: torch.Tensor | np.ndarray, hidden_size: int, context_size: int) -> torch.Tensor:
    """Check first-stage vectors: 2-D, width ``hidden_size``, at most ``context_size`` rows, finite. Returns them
    as float32 at least (half precision is widened; float64 stays float64, so a float64 model is not rounded
    through float32), still differentiable (training vectors keep their gradient path)."""
    if isinstance(vectors, np.ndarray):
        vectors = torch.from_numpy(vectors)
    if not isinstance(vectors, torch.Tensor):
        raise TypeError(f"Context vectors must be a torch.Tensor or numpy array, got {type(vectors).__name__}.")
    if vectors.ndim != 2 or vectors.shape[1] != hidden_size:
        raise ValueError(
            f"Context vectors must have shape (n, {hidden_size}) (first-stage output width); "
            f"got {tuple(vectors.shape)}."
        )
    if vectors.shape[0] > context_size:
        raise ValueError(
            f"Got {vectors.shape[0]} context vectors but the model has context_size={context_size}; "
            "sample at most that many documents (set_context(texts) samples for you)."
        )
    if not torch.isfinite(vectors.detach()).all():
        raise ValueError("Context vectors contain NaN or infinite values.")
    return vectors if vectors.dtype == torch.float64 else vectors.float()


class ActiveContext(nn.Module):
    """The active context: ``vectors`` (a non-persistent buffer, so it moves with ``model.to(device)`` and stays
    out of the weights file) and its record (``info``, ``texts``, ``token_ids``, ``weights``).

    An ``nn.Module`` only so that its buffer follows the module that owns it; it holds no parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("vectors", None, persistent=False)
        self.info: ContextInfo | None = None
        self.texts: list[str] | None = None  # the prompted documents, when the context was set from texts
        # Only their rows of the first stage's embedding table feed the vectors (see freshness.first_stage_fingerprint).
        self.token_ids: torch.Tensor | None = None
        self.weights: torch.Tensor | None = None  # first_stage_fingerprint the vectors were embedded with
        # Bumped in place whenever the context changes; moved to shared memory when pickled (a multi-process pool's
        # workers get such a copy), so a worker can tell that its copy went stale.
        self.generation = torch.zeros(1, dtype=torch.long)
        self.generation_seen = 0
        self.warned_stale = False
        self.warned_null = False  # until clear_context: said once that encoding uses the null context

    def __getstate__(self) -> dict:
        self.generation.share_memory_()  # in place: copies sent to other processes see later changes
        return super().__getstate__()

    def replace(
        self,
        vectors: torch.Tensor | None,
        info: ContextInfo | None,
        texts: list[str] | None,
        token_ids: torch.Tensor | None,
        weights: torch.Tensor | None,
        device: torch.device,
    ) -> None:
        """Make ``vectors`` (None: no context) the context, moved to ``device``. ``weights``: the first-stage
        fingerprint they were embedded with. The same ``info`` again (re-embedding after training) keeps the
        generation: the context is still the same one."""
        if info is not self.info:
            self.generation += 1
            self.generation_seen = int(self.generation)
        self.vectors = None if vectors is None else vectors.detach().to(device)
        self.info = info
        self.texts = texts
        self.token_ids = token_ids
        self.weights = None if vectors is None else weights
        self.warned_stale = False

    def snapshot(self) -> tuple:
        """The context as an opaque value for :meth:`ContextualTransformer.restore_context`."""
        return self.vectors, self.info, self.texts, self.weights

    def is_stale(self, fingerprint: Callable[[torch.Tensor | None], torch.Tensor]) -> bool:
        """Whether the first stage changed since the vectors were embedded. ``fingerprint(token_ids)``: the
        current first-stage fingerprint (:func:`~cde_st.modules.freshness.first_stage_fingerprint`), computed only when there are vectors."""
        if self.vectors is None or self.weights is None:
            return False
        return not torch.equal(fingerprint(self.token_ids), self.weights)

    def warn_stale_once(self) -> None:
        """Vectors given directly cannot be re-embedded: say once that they may be stale."""
        if not self.warned_stale:
            warnings.warn(
                "The first stage changed since the context vectors were set (given as vectors, so they cannot be "
                "recomputed): they may be stale. Call set_context(corpus_texts) again.",
                UserWarning,
                stacklevel=caller_stacklevel(),
            )
            self.warned_stale = True

    def warn_null_once(self, stacklevel: int | None = None) -> None:
        """Encoding without a context: say once (until :attr:`warned_null` is reset) that the null context is used.
        ``stacklevel``: as ``warnings.warn``'s, from this method (None: the user's line)."""
        if not self.warned_null:
            warnings.warn(
                "No context is set: encoding with the null context (the model then acts as a plain bi-encoder). "
                "Call model.set_context(corpus_texts) first, or pass context_vectors=.",
                UserWarning,
                stacklevel=caller_stacklevel() if stacklevel is None else stacklevel,
            )
            self.warned_null = True

    def check_pool_copy(self) -> None:
        """In a copy made for another process (a multi-process pool's worker): raise if the original's context
        changed since the copy was made, instead of encoding with the stale one."""
        if int(self.generation) != self.generation_seen:
            raise RuntimeError(
                "The context of this model changed after its multi-process pool was started, and the pool's workers "
                "still hold the old one. Start the pool after set_context (model.stop_multi_process_pool(pool); "
                "pool = model.start_multi_process_pool(...)), pass the context as context_vectors=, or load the "
                "model with cde_st.ContextualSentenceTransformer(path), whose pools always get the current context."
            )

    def save(self, output_path: str) -> None:
        """Write the vectors, with the documents they were sampled from (so a loaded model can re-embed them after
        more training), to ``output_path/context.safetensors``; without a context, remove a stale file."""
        context_path = os.path.join(output_path, CONTEXT_FILE)
        if self.vectors is not None:
            metadata = {"texts": json.dumps(self.texts)} if self.texts is not None else None
            vectors = {"vectors": self.vectors.detach().float().cpu().contiguous()}
            # safetensors writes 0o600 files: written atomically with the umask's mode, others can load them too
            write_path_atomically(context_path, lambda path: save_file(vectors, path, metadata=metadata), fsync=False)
        elif os.path.exists(context_path):
            os.remove(context_path)


def read_context_file(
    context_path: str,
    exists: bool,
    context_info: dict | None,
    config_path: str,
    validate: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, ContextInfo, list[str] | None] | None:
    """The saved context (vectors, info, texts) or None where ``cde_config.json`` records none.
    ``context.safetensors`` must agree with the ``context_info`` that ``cde_config.json`` records, and its vectors
    pass ``validate`` (:func:`validate_context_vectors` with the module's sizes)."""
    if context_info is None:
        if exists:
            warnings.warn(
                f"{context_path} is ignored: {config_path} records no context (context_info is null). "
                "The model loads with no context; call set_context(...) or delete the stray file.",
                UserWarning,
                stacklevel=caller_stacklevel(),
            )
        return None
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
    check_readable(context_path)
    try:
        with safe_open(context_path, framework="pt") as f:
            tensors = {key: f.get_tensor(key) for key in f.keys()}
            texts = (f.metadata() or {}).get("texts")  # the sampled documents, when set from texts
    except SafetensorError as exc:
        raise corrupt_file_error(context_path, exc) from None
    if "vectors" not in tensors:
        raise ValueError(f"{context_path} has no 'vectors' tensor (it holds {sorted(tensors)}).")
    try:
        vectors = validate(tensors["vectors"])
    except ValueError as exc:
        raise ValueError(f"{context_path}: {exc}") from None
    if len(vectors) != info.size:
        raise ValueError(
            f"{context_path} holds {len(vectors)} context vectors, but {config_path} records "
            f"context_info.size={info.size}: the two files do not belong together."
        )
    return vectors, info, json.loads(texts) if texts else None


def context_arguments(
    features: dict,
    context_vectors: torch.Tensor | None,
    context_mask: torch.Tensor | None,
    dataset_embeddings: torch.Tensor | None,
    unexpected: dict,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The context (None: the active one) and context mask of one forward, each given as a keyword or a
    ``features`` key; the context under either name (``context_vectors``, or ``dataset_embeddings``, the released
    models' name). Both names, a mask without a context, or any ``unexpected`` keyword (a misspelt name would
    otherwise leave the call on the active context without a word) is an error."""
    if unexpected:
        raise TypeError(
            f"ContextualTransformer.forward() got unexpected keyword argument(s) {sorted(unexpected)}; it accepts "
            "['context_mask', 'context_vectors', 'dataset_embeddings']."
        )
    given = {
        name: value if value is not None else features.get(name)
        for name, value in (("context_vectors", context_vectors), ("dataset_embeddings", dataset_embeddings))
    }
    given = {name: value for name, value in given.items() if value is not None}
    if len(given) > 1:
        raise TypeError(
            "forward() got both context_vectors= and dataset_embeddings= (its alias, the released models' name); "
            "pass one."
        )
    context_vectors = next(iter(given.values()), None)
    context_mask = features.get("context_mask") if context_mask is None else context_mask
    if context_mask is not None and context_vectors is None:
        raise ValueError("context_mask needs the context it masks: pass context_vectors as well.")
    return context_vectors, context_mask
