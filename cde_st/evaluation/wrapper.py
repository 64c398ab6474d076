"""The mteb encoder wrapper: task prefixes and per-task corpus context around any ``SentenceTransformer``.

mteb calls ``encode(inputs, task_metadata=..., hf_subset=..., hf_split=..., prompt_type=...)``. For each call the
wrapper

1. picks the task prefix from the task type and the query/document role (:class:`TaskPrefixes`);
2. for a contextual model, makes sure the model's context is the one :class:`~cde_st.evaluation.pools.ContextPlan`
   chose for that task/subset/split (sampled once from the task's loaded data, prefixed with the task's *document*
   prefix, embedded once by the first stage) before encoding anything; retrieval encodes its queries first, and
   they get the corpus context too;
3. encodes with ``encode_query`` / ``encode_document`` / ``encode`` like mteb's own sentence-transformers wrapper.

No text-keyed embedding cache is involved: the same text under two contexts has two embeddings.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from mteb.models.abs_encoder import AbsEncoder

from cde_st.evaluation.pools import ContextChoice, ContextPlan

if TYPE_CHECKING:
    from mteb.abstasks.task_metadata import TaskMetadata
    from mteb.types import PromptType
    from sentence_transformers import SentenceTransformer
    from torch.utils.data import DataLoader

logger = logging.getLogger(__name__)

#: mteb task types whose inputs are queries and documents (prefixes by role).
RETRIEVAL_TYPES = frozenset({"Retrieval", "Reranking", "InstructionRetrieval", "InstructionReranking"})
#: mteb task types using the classification / clustering prefix; every other type is "symmetric".
CLASSIFICATION_TYPES = frozenset({"Classification", "MultilabelClassification", "Regression"})
CLUSTERING_TYPES = frozenset({"Clustering"})


@dataclass(frozen=True)
class TaskPrefixes:
    """Nomic-style task prefixes, as CDE was trained with them.

    Retrieval and reranking: queries get ``query``, documents ``document``. Classification: ``classification``.
    Clustering: ``clustering``. Symmetric tasks (STS, pair classification, summarization, bitext mining) use
    ``symmetric``, the classification prefix by default, as in Nomic's MTEB evaluation. Context documents get the
    document prefix of their task: ``document`` for retrieval, the task's own prefix otherwise.

    Example:
        >>> p = TaskPrefixes().with_overrides({"query": "q: "})
        >>> p.for_inputs("Retrieval", "query"), p.for_context("Clustering")
        ('q: ', 'clustering: ')
    """

    query: str = "search_query: "
    document: str = "search_document: "
    classification: str = "classification: "
    clustering: str = "clustering: "
    symmetric: str = "classification: "

    @classmethod
    def off(cls) -> TaskPrefixes:
        """No prefixes at all."""
        return cls(**{f.name: "" for f in fields(cls)})

    def with_overrides(self, overrides: Mapping[str, str] | None) -> TaskPrefixes:
        """A copy with some roles replaced; unknown role names raise."""
        if not overrides:
            return self
        roles = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - roles)
        if unknown:
            raise ValueError(f"Unknown prefix role(s) {unknown}; choose from {sorted(roles)}.")
        return replace(self, **dict(overrides))

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    def for_inputs(self, task_type: str, prompt_type: PromptType | str | None) -> str:
        """Prefix of the texts mteb encodes for a task of ``task_type`` in role ``prompt_type``."""
        if task_type in RETRIEVAL_TYPES:
            role = getattr(prompt_type, "value", prompt_type)
            return self.query if role == "query" else self.document
        return self.for_context(task_type)

    def for_context(self, task_type: str) -> str:
        """Prefix of the context documents of a task of ``task_type`` (its document prefix)."""
        if task_type in RETRIEVAL_TYPES:
            return self.document
        if task_type in CLASSIFICATION_TYPES:
            return self.classification
        if task_type in CLUSTERING_TYPES:
            return self.clustering
        return self.symmetric


def is_contextual_model(model: Any) -> bool:
    """Whether ``model`` is a CDE contextual model (uses ``cde_st.is_contextual`` when the plugin provides it)."""
    try:
        from cde_st import is_contextual
    except ImportError:  # the model API is not installed: nothing is contextual
        return False
    return bool(is_contextual(model))


def _set_model_context(model: Any, texts: list[str], seed: int, prompt: str, batch_size: int = 32) -> Any:
    """Make the already-sampled ``texts`` (J of them) the model's active context, prefixed with ``prompt``.

    With J equal to the model's context slots, ``cde_st.set_context`` samples all of them back (same documents);
    with fewer, their first-stage vectors are set and the remaining slots hold the null vector.
    """
    from cde_st import contextual_module, set_context

    module = contextual_module(model)
    if len(texts) > module.context_size:
        raise ValueError(
            f"Context size {len(texts)} exceeds the model's {module.context_size} context slots; "
            f"choose J <= {module.context_size}."
        )
    if len(texts) == module.context_size:
        return set_context(model, texts, seed=seed, prompt=prompt, batch_size=batch_size)
    vectors = module.embed_context_texts([prompt + t for t in texts], batch_size=batch_size)
    return set_context(model, vectors)


def _clear_model_context(model: Any) -> None:
    from cde_st import contextual_module

    contextual_module(model).clear_context()


def _model_context_info(model: Any) -> Any:
    from cde_st import contextual_module

    return contextual_module(model).context_info


class ContextualEncoderWrapper(AbsEncoder):
    """An mteb ``EncoderProtocol`` for plain and contextual sentence-transformers models.

    Args:
        model: any ``SentenceTransformer`` (a CDE model or a plain bi-encoder).
        plan: the context plan of the run (ignored for plain models; ``None`` = no context).
        prefixes: task prefixes (``None``: no prefixes; the model's own ``prompts`` then apply as in mteb).
        model_meta: the ``mteb.models.ModelMeta`` naming this run in results (see :func:`build_model_meta`).
    """

    def __init__(
        self,
        model: SentenceTransformer,
        *,
        plan: ContextPlan | None,
        prefixes: TaskPrefixes | None,
        model_meta: Any,
    ) -> None:
        self.model = model
        self.plan = plan
        self.prefixes = prefixes
        self.mteb_model_meta = model_meta
        self.contextual = is_contextual_model(model)
        # What this wrapper last put on the model, and the ContextInfo object the model then held: the model may
        # be shared (a sweep runs one wrapper per J), so the state counts only while the model still holds it.
        self._active_context: tuple[Any, ...] | None = None
        self._active_info: Any = None
        self.context_log: list[dict[str, Any]] = []
        self.batch_size = 32

    # -- mteb protocol ------------------------------------------------------------------------------------------
    def encode(
        self,
        inputs: DataLoader,
        *,
        task_metadata: TaskMetadata,
        hf_split: str,
        hf_subset: str,
        prompt_type: PromptType | None = None,
        **kwargs: Any,
    ) -> np.ndarray:
        texts = [text for batch in inputs for text in batch["text"]]
        self.batch_size = kwargs.get("batch_size", self.batch_size)
        if self.contextual:
            self._ensure_context(task_metadata, hf_subset, hf_split)
        prompt = self._prompt(task_metadata, prompt_type)
        role = getattr(prompt_type, "value", prompt_type)
        if role == "query":
            encode_fn = self.model.encode_query
        elif role == "document":
            encode_fn = self.model.encode_document
        else:
            encode_fn = self.model.encode
        with warnings.catch_warnings():
            if self._active_context == ("none",):  # the null context is what this run asked for
                warnings.filterwarnings("ignore", message="No context is set", category=UserWarning)
            embeddings = encode_fn(
                texts,
                prompt=prompt,
                batch_size=kwargs.get("batch_size", 32),
                show_progress_bar=kwargs.get("show_progress_bar", True),
                convert_to_numpy=True,
            )
        return np.asarray(embeddings, dtype=np.float32)

    # -- prefixes and context -----------------------------------------------------------------------------------
    def _prompt(self, task_metadata: TaskMetadata, prompt_type: PromptType | None) -> str | None:
        if self.prefixes is not None:
            return self.prefixes.for_inputs(task_metadata.type, prompt_type)
        # No kit prefixes: the model's own prompts, chosen the way mteb's sentence-transformers wrapper does.
        from mteb.models.abs_encoder import get_prompt

        prompts = {k: v for k, v in (getattr(self.model, "prompts", None) or {}).items() if v}
        prompt = get_prompt(prompts or None, task_metadata, prompt_type)
        if prompt is None:  # encode() would apply the model's default prompt: say so, so the context gets it too
            prompt = prompts.get(getattr(self.model, "default_prompt_name", None) or "")
        return prompt

    def _context_prompt(self, task_metadata: TaskMetadata) -> str:
        """The prefix of the task's context documents: whatever its documents are encoded with."""
        if self.prefixes is not None:
            return self.prefixes.for_context(task_metadata.type)
        from mteb.types import PromptType

        role = PromptType.document if task_metadata.type in RETRIEVAL_TYPES else None
        return self._prompt(task_metadata, role) or ""

    def _ensure_context(self, task_metadata: TaskMetadata, hf_subset: str, hf_split: str) -> None:
        choice: ContextChoice | None = None
        if self.plan is not None:
            choice = self.plan.choose(task_metadata.name, hf_subset, hf_split)
        holds_ours = _model_context_info(self.model) is self._active_info
        if choice is None:
            if self._active_context != ("none",) or not holds_ours:
                _clear_model_context(self.model)
                self._active_info = None
                self._active_context = ("none",)
                self.context_log.append({"task": task_metadata.name, "subset": hf_subset, "split": hf_split, "size": 0})
            return
        prompt = self._context_prompt(task_metadata)
        state = (choice.key, choice.fingerprint, prompt)
        if state != self._active_context or not holds_ours:
            self._active_info = _set_model_context(
                self.model, choice.texts, seed=choice.seed, prompt=prompt, batch_size=self.batch_size
            )
            self._active_context = state
            self.context_log.append(
                {
                    "task": choice.key[0],
                    "subset": choice.key[1],
                    "pool_split": choice.key[2],
                    "size": len(choice.texts),
                    "seed": choice.seed,
                    "source": choice.source,
                    "pool_size": choice.pool_size,
                    "prompt": prompt,
                    "fingerprint": choice.fingerprint,
                }
            )

    def release(self) -> None:
        """Clear the context this wrapper set on a contextual model."""
        if self.contextual and self._active_context is not None:
            _clear_model_context(self.model)
        self._active_context = None
        self._active_info = None


def embedding_dimension(model: Any) -> int | None:
    """Output dimension of a sentence-transformers model (``get_embedding_dimension`` since 6.0)."""
    getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return getter()


def build_model_meta(
    model: SentenceTransformer, *, name: str, revision: str, experiment_kwargs: Mapping[str, Any] | None
) -> Any:
    """The ``mteb.models.ModelMeta`` of a run: ``name`` (``org/model``), ``revision`` and the run settings as
    ``experiment_kwargs`` (so results of different contexts, sizes and seeds are stored apart)."""
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
    from cde_st.evaluation.runner import default_model_name, parameter_fingerprint

    info = _model_context_info(model) if is_contextual_model(model) else None
    context = f"ctx-{info.fingerprint}" if info is not None else "ctx-none"
    return build_model_meta(
        model,
        name=name or default_model_name(model, None),
        revision=f"{revision or parameter_fingerprint(model)}-{context}",
        experiment_kwargs=None,
    )
