"""The foreign documents of ``context="random"``: a task's context is drawn from documents that are not its own,
either a fixed corpus (``random_corpus``: texts, a ``.txt`` / ``.jsonl`` file or a task, :func:`load_text_corpus`)
or the pools of the run's other tasks (:func:`foreign_pool`). :func:`~cde_st.evaluation.runner.evaluate_model`
builds one per run; the context plan of :mod:`~cde_st.evaluation.pools` draws from it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cde_st.context import sample_context
from cde_st.data import document_text, read_jsonl
from cde_st.evaluation.pools import context_pool, unique_texts
from cde_st.evaluation.tasks import UnknownTaskError, first_subset_split, load_task_data, resolve_task

__all__ = ["foreign_pool", "load_text_corpus"]


#: File names ``random_corpus`` reads as files (a missing one is a missing file, not an unknown task).
_CORPUS_FILE_SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".json", ".gz")


def load_text_corpus(spec: str | Path | Sequence[str], data_dir: str | Path | None = None) -> tuple[list[str], str]:
    """Documents of a "random" context corpus and a short name for it: a list of texts; a ``.txt`` (one document
    per line) or ``.jsonl[.gz]`` file (``text`` field, with ``title`` prepended when present); or a local task /
    folder, whose context pool (for its first subset and split) is the corpus."""
    if not isinstance(spec, (str, Path)):
        texts = unique_texts(spec)
        digest = hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:8]
        return texts, f"texts-{digest}"
    path = Path(spec).expanduser()
    if not path.exists() and path.name.endswith(_CORPUS_FILE_SUFFIXES):
        raise FileNotFoundError(
            f"random_corpus (--random-corpus) {str(spec)!r}: no such file ({path.resolve()}). Give an existing .txt "
            "(one document per line) or .jsonl[.gz] file, a local task folder, or a task name."
        )
    if path.is_file():
        if path.suffix == ".txt":
            texts = unique_texts(path.read_text(encoding="utf-8").splitlines())
        else:
            rows = read_jsonl(path, ["text"], optional=["title"])
            texts = unique_texts(document_text(r.get("title", ""), r["text"]) for r in rows)
        return texts, path.name
    try:
        task = resolve_task(str(spec), data_dir)
    except UnknownTaskError as err:
        raise UnknownTaskError(
            f"random_corpus (--random-corpus) {str(spec)!r} is not a file, a folder or a task. {err}"
        ) from None
    load_task_data(task, data_dir)
    texts = context_pool(task, *first_subset_split(task))
    return texts, task.metadata.name


def foreign_pool(
    tasks: list[Any], random_corpus: Any, data_dir: Any, max_size: int, seed: int
) -> tuple[Callable[[str], list[str]], str]:
    """The foreign-document function of ``context="random"`` and its name for the results."""
    if random_corpus is not None:
        texts, name = load_text_corpus(random_corpus, data_dir)
        return (lambda _task: texts), name
    if len(tasks) < 2:
        raise ValueError(
            "context='random' takes documents from the other tasks of the run, but there is only one task; "
            "give a fixed foreign corpus with random_corpus= (--random-corpus)."
        )
    # A bounded seeded sample of every task's pool, read once up front; the random context of task T is then
    # drawn from the samples of all *other* tasks.
    samples: dict[str, list[str]] = {}
    for task in tasks:
        was_loaded = task.data_loaded
        load_task_data(task, data_dir)
        pool = context_pool(task, *first_subset_split(task))
        samples[task.metadata.name] = sample_context(pool, min(len(pool), max_size), seed)
        if not was_loaded:
            task.unload_data()

    def others(task_name: str) -> list[str]:
        return unique_texts(t for name, texts in samples.items() if name != task_name for t in texts)

    return others, "other-tasks"
