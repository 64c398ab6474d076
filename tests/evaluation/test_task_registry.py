"""Local copies of published mteb tasks are scored as those tasks (twins by folder name and registry)."""

from __future__ import annotations

import pytest
from evaluation_helpers import (
    make_classification,
    make_self_retrieval,
    make_sts,
)

from cde_st.evaluation.local_tasks import load_local_task


def test_local_copy_of_an_mteb_task_reuses_its_definition(tmp_path):
    folder = make_classification(tmp_path, "tweet_sentiment_extraction")
    task = load_local_task(folder)
    assert task.metadata.name == "tweet_sentiment_extraction"
    assert type(task).__mro__[2].__name__ == "TweetSentimentExtractionClassification"
    assert task.samples_per_label == 32 and task.n_experiments == 10
    assert task.metadata.superseded_by is None and task.metadata.adapted_from == [
        "TweetSentimentExtractionClassification"
    ]
    amazon = load_local_task(make_classification(tmp_path, "amazon_counterfactual_en"))
    assert amazon.hf_subsets == ["en"] and amazon.metadata.eval_splits == ["test"]  # no validation file here
    other = make_classification(tmp_path, "my_reviews")
    assert load_local_task(other, twin="AmazonCounterfactualClassification:de").hf_subsets == ["de"]
    with pytest.raises(ValueError, match="name one as twin="):
        load_local_task(other, twin="AmazonCounterfactualClassification")
    assert type(load_local_task(other, twin="")).__mro__[2].__name__ == "AbsTaskClassification"


def test_sickr_twin_evaluates_the_whole_corpus_like_mteb(tmp_path):
    # mteb's SICK-R "test" split is all of SICK (train + trial + test); a local copy keeps SICK's splits
    folder = make_sts(tmp_path, "sickr")
    (folder / "train.jsonl").write_text((folder / "test.jsonl").read_text())
    task = load_local_task(folder)
    assert type(task).__mro__[2].__name__ == "SickrSTS" and task.metadata.eval_splits == ["test"]
    task.load_data()
    assert len(task.dataset["test"]) == 22


@pytest.mark.parametrize(
    ("folder", "twin", "ignore"),
    [("arguana", "ArguAna", True), ("QUORA", "QuoraRetrieval", True), ("scidocs", "SCIDOCS", False)],
)
def test_local_folder_named_after_any_mteb_task_takes_its_settings(tmp_path, folder, twin, ignore):
    """Issue: only the shared folder names were recognised; a local ArguAna copy was scored as a generic
    retrieval task (each query retrieving itself). Names come from mteb's registry: task name or dataset name,
    any case."""
    task = load_local_task(make_self_retrieval(tmp_path, folder))
    assert task.metadata.adapted_from == [twin] and task.metadata.name == folder
    assert twin.lower() in {c.__name__.lower() for c in type(task).__mro__} or any(
        getattr(c, "metadata", None) is not None and c.metadata.name == twin for c in type(task).__mro__[1:]
    )
    assert task.ignore_identical_ids is ignore
    assert f"mteb task {twin}" in task.identical_ids_rule
