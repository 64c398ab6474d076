"""Task prefixes of the evaluation kit: which prompt each text of an mteb task is encoded with.

CDE models are trained with Nomic-style task prefixes (:mod:`cde_st.prompts`); evaluating them without, or with the
wrong one, costs points. :class:`TaskPrefixes` maps an mteb task type and a text's role (query, document, context
document) to its prefix; the mteb wrapper and the beir search both take theirs from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING

from cde_st.prompts import CLASSIFICATION_PROMPT, CLUSTERING_PROMPT, DOCUMENT_PROMPT, QUERY_PROMPT

if TYPE_CHECKING:
    from mteb.types import PromptType

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

    query: str = QUERY_PROMPT
    document: str = DOCUMENT_PROMPT
    classification: str = CLASSIFICATION_PROMPT
    clustering: str = CLUSTERING_PROMPT
    symmetric: str = CLASSIFICATION_PROMPT

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
