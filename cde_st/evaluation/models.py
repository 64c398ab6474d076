"""The evaluated model named in results: model name, revision, and the ``mteb.models.ModelMeta`` that keys mteb's
result cache (loading it is :func:`cde_st.model_loading.load_model`, shared with the other commands).

A contextual model's scores depend on its context, so a result's revision must say which context it was computed
with: :func:`evaluate_model` puts the run settings in ``experiment_kwargs``; :func:`mteb_model_meta` does it for
people who call mteb directly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sentence_transformers import SentenceTransformer

from cde_st.evaluation.model_context import is_contextual_model, model_context_info

__all__ = ["build_model_meta", "default_model_name", "embedding_dimension", "mteb_model_meta", "weights_revision"]


def default_model_name(model: Any, spec: str | Path | None) -> str:
    """``org/name`` for results: the hub id, ``local/<folder>`` for a folder, else from the model card."""
    if spec is not None:
        text = str(spec)
        path = Path(text).expanduser()
        if path.exists():
            resolved = path.resolve()
            generic = resolved.name.lower() in {"model", "models", "final", "best", "output", "checkpoint"}
            return f"local/{resolved.parent.name if generic else resolved.name}"
        return text if "/" in text else f"local/{text}"
    card = getattr(model, "model_card_data", None)
    name = getattr(card, "model_name", None) or getattr(card, "base_model", None)
    if name:
        return name if "/" in name else f"local/{name}"
    return f"local/{type(model).__name__}"


def weights_revision(model: Any) -> str:
    """The default result revision (``params-`` and 12 hex digits): a hash of every weight byte, so checkpoints that
    differ in any value never share results. Not :func:`cde_st.fingerprints.model_fingerprint` (a sample of the
    values): a result cache must not hand back another checkpoint's scores."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return f"params-{digest.hexdigest()[:12]}"


def embedding_dimension(model: Any) -> int | None:
    """Output dimension of a sentence-transformers model (``get_embedding_dimension`` since 6.0)."""
    getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return getter()


def build_model_meta(
    model: SentenceTransformer, *, name: str, revision: str, experiment_kwargs: Mapping[str, Any] | None
) -> Any:
    """The ``mteb.models.ModelMeta`` of a run: ``name`` (``org/model``), ``revision`` and the run settings as
    ``experiment_kwargs`` (so results of different contexts, sizes and seeds are stored apart)."""
    # mteb is imported on use: importing it takes seconds, and loading or naming a model does not need it
    from mteb.models import ModelMeta
    from mteb.models.model_meta import ScoringFunction

    similarity = getattr(model, "similarity_fn_name", None)
    return ModelMeta.create_empty(
        overwrites={
            "name": name,
            "revision": revision,
            "loader": None,
            "max_tokens": getattr(model, "max_seq_length", None),
            "embed_dim": embedding_dimension(model),
            "similarity_fn_name": ScoringFunction.from_str(similarity) if similarity else None,
            "framework": ["Sentence Transformers", "PyTorch"],
            "experiment_kwargs": dict(experiment_kwargs) if experiment_kwargs else None,
        }
    )


def mteb_model_meta(model: SentenceTransformer, *, name: str | None = None, revision: str | None = None) -> Any:
    """The ``mteb.models.ModelMeta`` to evaluate ``model`` *as it is now* with mteb directly: its name, and a
    revision that includes the active context's fingerprint (``ctx-none`` without one).

    mteb names a local model ``no_model_name/available`` and, by default, returns cached results without encoding
    anything; for a contextual model that silently gives the score of whichever context ran first. Call this after
    every ``set_context`` and put the name/revision on the model card (or use a fresh ``ResultCache``, or
    ``overwrite_strategy="always"``). ``evaluate_model`` needs none of this: it keys results itself.

    Args:
        model: a (contextual or plain) sentence-transformers model.
        name: ``org/name`` (default: the model card's name, else ``local/<class>``).
        revision: the model part of the revision (default: a hash of the weights).

    Example:
        >>> set_context(model, corpus_texts)  # doctest: +SKIP
        >>> meta = mteb_model_meta(model, name="me/my-cde")  # doctest: +SKIP
        >>> model.model_card_data.model_name = meta.name  # doctest: +SKIP
        >>> model.model_card_data.base_model_revision = meta.revision  # doctest: +SKIP
        >>> mteb.evaluate(model, task, cache=cache)  # doctest: +SKIP
    """
    info = model_context_info(model) if is_contextual_model(model) else None
    context = f"ctx-{info.fingerprint}" if info is not None else "ctx-none"
    return build_model_meta(
        model,
        name=name or default_model_name(model, None),
        revision=f"{revision or weights_revision(model)}-{context}",
        experiment_kwargs=None,
    )
