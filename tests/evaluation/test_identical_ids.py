"""Query ids that are also corpus ids: ignored only when the queries are corpus documents."""

from __future__ import annotations

import pytest
from evaluation_helpers import (
    loaded,
    make_numbered_collection,
    make_self_retrieval,
)

from cde_st.evaluation.local_tasks import load_local_task


def test_generic_folder_whose_queries_are_corpus_documents_ignores_identical_ids(
    data_dir, tmp_path, tiny_plain_model, caplog
):
    from cde_st.evaluation import evaluate_model

    make_self_retrieval(data_dir, "my_arguments")
    kwargs = dict(data_dir=data_dir, output_dir=tmp_path / "out", batch_size=8, show_progress_bar=False)
    with caplog.at_level("WARNING", logger="cde_st.evaluation.identical_ids"):
        auto = evaluate_model(tiny_plain_model, ["my_arguments", "tinyret"], **kwargs)
    rule = auto.task_settings["my_arguments"]["identical_ids"]
    assert rule.startswith("ignore") and "6 of 6 query ids are also corpus ids" in rule
    assert "the queries are corpus documents" in rule  # decided from the texts, and says so
    assert any("my_arguments" in r.getMessage() and "identical" in r.getMessage() for r in caplog.records)
    assert auto.task_settings["tinyret"]["identical_ids"].startswith("keep")  # no overlap: nothing to ignore
    assert "my_arguments" in auto.files["summary_md"].read_text() and rule in auto.files["summary_md"].read_text()
    ignore = evaluate_model(
        tiny_plain_model, ["my_arguments"], identical_ids="ignore", **{**kwargs, "output_dir": None}
    )
    keep = evaluate_model(tiny_plain_model, ["my_arguments"], identical_ids="keep", **{**kwargs, "output_dir": None})
    assert auto.score("my_arguments") == pytest.approx(ignore.score("my_arguments"))
    assert keep.score("my_arguments") < auto.score("my_arguments")  # each query found itself first
    assert keep.task_settings["my_arguments"]["identical_ids"].startswith("keep")
    # the option overrides an mteb twin's own setting too, and the command line has it
    assert not load_local_task(make_self_retrieval(tmp_path, "arguana"), identical_ids="keep").ignore_identical_ids
    from cde_st.cli import _eval_parser

    args = _eval_parser().parse_args(["--model", "m", "--tasks", "t", "--identical-ids", "keep"])
    assert args.identical_ids == "keep"


def test_ids_that_merely_coincide_keep_the_query_own_document(tmp_path, tiny_plain_model):
    """a folder numbering queries and documents 1..N got BEIR's rule, so document 7, judged relevant to
    query 7, was removed from query 7's results. auto decides from the texts and says why."""
    from cde_st.evaluation import evaluate_model

    folder = make_numbered_collection(tmp_path)
    task = loaded(folder)
    assert task.ignore_identical_ids is False
    assert (
        task.identical_ids_rule.startswith("keep") and "the ids coincide, the texts differ" in task.identical_ids_rule
    )
    assert "6 of 6 query ids are also corpus ids" in task.identical_ids_rule
    kwargs = dict(output_dir=None, batch_size=8, show_progress_bar=False)
    auto = evaluate_model(tiny_plain_model, [folder], **kwargs)
    ignore = evaluate_model(tiny_plain_model, [folder], identical_ids="ignore", **kwargs)
    assert auto.score("classic") > 0 and ignore.score("classic") == 0  # every relevant document was removed
    assert "the ids coincide" in auto.task_settings["classic"]["identical_ids"]
    assert ignore.task_settings["classic"]["identical_ids"].startswith("ignore")


def test_queries_are_documents_rule():
    from cde_st.evaluation.identical_ids import queries_are_documents

    docs = {"1": "Title  The Cat sat", "2": "other", "3": "third doc"}
    assert queries_are_documents({"1": "the cat SAT", "2": "other"}, docs)[0] is True
    assert queries_are_documents({"1": "dogs", "2": "birds", "3": "third doc"}, docs)[0] is False  # 1 of 3
    ignore, why = queries_are_documents({"9": "x"}, docs)
    assert ignore is False and "no query id is also a corpus id" in why


@pytest.mark.slow
@pytest.mark.parametrize("name", ["med", "cacm", "lisa"])
def test_classic_collections_keep_identical_ids(shared_data, name):
    task = loaded(shared_data / "retrieval" / name)
    assert task.ignore_identical_ids is False, task.identical_ids_rule
    assert "the ids coincide, the texts differ" in task.identical_ids_rule


@pytest.mark.parametrize("query", ["", "report", "number"], ids=["empty", "one_word", "one_word_b"])
def test_short_queries_contained_by_chance_are_not_the_documents(query):
    """A one-word or empty query is "contained" in almost any document: that says nothing about whether it is the
    document, so the rule must not remove the query's own (relevant) document for it."""
    from cde_st.evaluation.identical_ids import queries_are_documents

    docs = {str(i): f"report number {i} on a topic" for i in range(1, 7)}
    queries = {str(i): query for i in range(1, 7)}
    ignore, why = queries_are_documents(queries, docs)
    assert ignore is False, why


def test_a_query_judged_relevant_to_its_own_id_keeps_it():
    """When the judgements say a query's own id is relevant to it, ignoring identical ids would remove a relevant
    document: the rule keeps them, whatever the texts look like."""
    from cde_st.evaluation.identical_ids import queries_are_documents

    docs = {str(i): f"the cat sat on mat {i}" for i in range(1, 4)}
    queries = {str(i): f"the cat sat on mat {i}" for i in range(1, 4)}  # the same texts
    assert queries_are_documents(queries, docs)[0] is True
    ignore, why = queries_are_documents(queries, docs, {"1": {"1": 1}, "2": {"3": 1}})
    assert ignore is False and "judged relevant" in why


@pytest.mark.parametrize("query", ["", "report"], ids=["empty", "one_word"])
def test_short_queries_keep_their_relevant_documents_end_to_end(tmp_path, tiny_plain_model, query):
    """A classic numbered collection whose queries are one word or empty scores its own relevant documents."""
    from evaluation_helpers import write_jsonl

    from cde_st.evaluation import evaluate_model

    folder = make_numbered_collection(tmp_path)
    write_jsonl(folder / "queries.jsonl", [{"_id": str(i), "text": query or " "} for i in range(1, 7)])
    task = loaded(folder)
    assert task.ignore_identical_ids is False, task.identical_ids_rule
    result = evaluate_model(tiny_plain_model, [folder], output_dir=None, batch_size=8, show_progress_bar=False)
    assert result.score("classic") > 0
