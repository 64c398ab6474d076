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
from typing import TYPE_CHECKING, Any

import numpy as np
from mteb.models.abs_encoder import AbsEncoder, get_prompt
from mteb.types import PromptType

from cde_st.evaluation.model_context import (
    clear_model_context,
    is_contextual_model,
    model_context_info,
    set_model_context,
)
from cde_st.evaluation.pools import ContextChoice, ContextPlan
from cde_st.evaluation.prefixes import RETRIEVAL_TYPES, TaskPrefixes

if TYPE_CHECKING:
    from mteb.abstasks.task_metadata import TaskMetadata
    from sentence_transformers import SentenceTransformer
    from torch.utils.data import DataLoader

logger = logging.getLogger(__name__)


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
        if kwargs.get("show_progress_bar", True):
            # The encoder's bar counts batches with a time estimate but says nothing of what they are.
            what = {"query": "queries", "document": "documents"}.get(role, "texts")
            info = model_context_info(self.model) if self.contextual else None
            context = f" with a context of {info.size} documents" if info is not None else ""
            split = f"{hf_split}, {hf_subset}" if hf_subset not in (None, "", "default") else hf_split
            logger.info("%s (%s): encoding %s %s%s", task_metadata.name, split, f"{len(texts):,}", what, context)
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
        prompts = {k: v for k, v in (getattr(self.model, "prompts", None) or {}).items() if v}
        prompt = get_prompt(prompts or None, task_metadata, prompt_type)
        if prompt is None:  # encode() would apply the model's default prompt: say so, so the context gets it too
            prompt = prompts.get(getattr(self.model, "default_prompt_name", None) or "")
        return prompt

    def _context_prompt(self, task_metadata: TaskMetadata) -> str:
        """The prefix of the task's context documents: whatever its documents are encoded with."""
        if self.prefixes is not None:
            return self.prefixes.for_context(task_metadata.type)
        role = PromptType.document if task_metadata.type in RETRIEVAL_TYPES else None
        return self._prompt(task_metadata, role) or ""

    def _ensure_context(self, task_metadata: TaskMetadata, hf_subset: str, hf_split: str) -> None:
        choice: ContextChoice | None = None
        if self.plan is not None:
            choice = self.plan.choose(task_metadata.name, hf_subset, hf_split)
        holds_ours = model_context_info(self.model) is self._active_info
        if choice is None:
            if self._active_context != ("none",) or not holds_ours:
                clear_model_context(self.model)
                self._active_info = None
                self._active_context = ("none",)
                self.context_log.append({"task": task_metadata.name, "subset": hf_subset, "split": hf_split, "size": 0})
            return
        prompt = self._context_prompt(task_metadata)
        state = (choice.key, choice.fingerprint, prompt)
        if state != self._active_context or not holds_ours:
            logger.info("%s: embedding the context, %d documents (first stage)", task_metadata.name, len(choice.texts))
            self._active_info = set_model_context(
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
            clear_model_context(self.model)
        self._active_context = None
        self._active_info = None
