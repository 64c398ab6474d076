"""MTEB evaluation kit: per-task corpus context, task prefixes, local task folders, Table 2 summaries.

The public entry point is :func:`evaluate_model` (``eval/run_mteb.py`` is a command line over it). Submodules:
``local_tasks`` (local folders -> mteb tasks), ``pools`` (context pools per task type), ``wrapper`` (the mteb
encoder wrapper), ``report`` (summary tables and plots), ``runner`` (the run), ``beir_search`` (beir's exact
search with the corpus context: :class:`ContextualExactSearch`, needs ``pip install 'cde_st[beir]'``),
``evaluators`` (in-training sentence-transformers evaluators that score a contextual model with a corpus context).

Names are imported lazily so that ``import cde_st.evaluation`` does not import mteb.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "evaluate_model": "runner",
    "EvaluationReport": "runner",
    "RunResult": "runner",
    "UnknownTaskError": "runner",
    "TaskDataError": "runner",
    "load_model": "runner",
    "resolve_task": "runner",
    "load_local_task": "local_tasks",
    "LocalDataError": "local_tasks",
    "MTEB_TWINS": "local_tasks",
    "ContextPlan": "pools",
    "context_pool": "pools",
    "ContextualEncoderWrapper": "wrapper",
    "TaskPrefixes": "wrapper",
    "mteb_model_meta": "wrapper",
    "TaskScore": "report",
    "ContextualExactSearch": "beir_search",
    "ContextualRetrievalEvaluator": "evaluators",
    "ContextualEvaluator": "evaluators",
    "corpus_context": "evaluators",
    "with_corpus_context": "evaluators",
    "check_scorable": "evaluators",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
