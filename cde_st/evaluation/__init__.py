"""MTEB evaluation kit: per-task corpus context, task prefixes, local task folders, Table 2 summaries.

The public entry point is :func:`evaluate_model` (``eval/run_mteb.py`` is a command line over it). Submodules:

- ``runner``: the run (:func:`evaluate_model`); ``tasks``: task names and folders -> mteb tasks with loaded data;
  ``models``: naming the model in results; ``provenance``: when a cached result may be reused;
  ``report``: summary tables and plots.
- ``local_folders``: the five local formats and what a folder holds; ``local_tasks``: local folders -> mteb tasks;
  ``task_registry``: the published mteb task a local folder copies; ``identical_ids``: the rule for query ids that
  are also corpus ids. Files are read by :mod:`cde_st.data`.
- ``pools``: the context pool of each task type and the context plan of a run; ``random_corpus``: the foreign
  documents of ``context="random"``; ``model_context``: setting J documents as the model's context; ``prefixes``:
  task prefixes; ``wrapper``: the mteb encoder wrapper.
- ``beir_search``: beir's exact search with the corpus context (:class:`ContextualExactSearch`, needs
  ``pip install 'cde_st[beir]'``); ``evaluators``: in-training sentence-transformers evaluators that score a
  contextual model with a corpus context.

Names are imported lazily so that ``import cde_st.evaluation`` does not import mteb.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "evaluate_model": "runner",
    "EvaluationReport": "runner",
    "RunResult": "runner",
    "UnknownTaskError": "tasks",
    "TaskDataError": "tasks",
    "resolve_task": "tasks",
    "load_model": "runner",
    "mteb_model_meta": "models",
    "load_local_task": "local_tasks",
    "LocalDataError": "local_tasks",
    "MTEB_TWINS": "task_registry",
    "ContextPlan": "pools",
    "context_pool": "pools",
    "ContextualEncoderWrapper": "wrapper",
    "TaskPrefixes": "prefixes",
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
