"""Task resolution and loading: unknown names, offline hub tasks, hub retrieval judgements."""

from __future__ import annotations

import pytest

from cde_st.evaluation.local_tasks import LocalDataError


def test_unknown_task_errors(data_dir):
    from cde_st.evaluation.tasks import UnknownTaskError, resolve_task

    with pytest.raises(UnknownTaskError, match=r"Unknown task 'tinyrett'.*Did you mean: tinyret"):
        resolve_task("tinyrett", data_dir)
    with pytest.raises(UnknownTaskError, match="--data-dir"):
        resolve_task("no_such_task_anywhere", None)


def test_hub_task_offline_gives_a_clear_error(data_dir, monkeypatch):
    import mteb

    from cde_st.evaluation.tasks import TaskDataError, load_task_data

    task = mteb.get_task("STS12")

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'mteb/sts12-sts' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(task, "load_data", offline)
    with pytest.raises(TaskDataError, match="STS12.*Hugging Face hub.*local folder"):
        load_task_data(task, data_dir)


def test_hub_retrieval_data_with_missing_documents_fails(monkeypatch):
    """The same check for mteb's own (hub) retrieval tasks, after mteb loaded them."""
    import mteb
    from datasets import Dataset

    from cde_st.evaluation.tasks import load_task_data

    task = mteb.get_task("SciFact")

    def load(**kwargs):
        corpus = Dataset.from_dict({"id": ["1", "2"], "title": ["", ""], "text": ["a", "b"]})
        queries = Dataset.from_dict({"id": ["q1", "q2"], "text": ["x", "y"]})
        relevant = {"q1": {"101": 1}, "q2": {"102": 1}}
        task.dataset = {"default": {"test": {"corpus": corpus, "queries": queries, "relevant_docs": relevant}}}
        task.data_loaded = True

    monkeypatch.setattr(task, "load_data", load)
    with pytest.raises(LocalDataError, match=r"SciFact.*test.*2 of 2.*'101'"):
        load_task_data(task, None)
