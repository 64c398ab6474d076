"""Local task folders as mteb tasks: per-format loaders, validation at load, relevance judgements."""

from __future__ import annotations

import gzip
import json

import pytest
from evaluation_helpers import (
    loaded,
    make_classification,
    make_clustering,
    make_pairs,
    make_retrieval,
    make_sts,
    rewrite_qrels,
    write_jsonl,
)

from cde_st.evaluation.local_folders import TASK_KINDS, detect_kind
from cde_st.evaluation.local_tasks import LocalDataError, load_local_task


def test_detect_kind_from_type_folder_and_from_files(data_dir, tmp_path):
    for kind in TASK_KINDS:
        (folder,) = (data_dir / kind).iterdir()
        assert detect_kind(folder) == kind
    # outside a type folder the files decide
    assert detect_kind(make_retrieval(tmp_path / "x", "a").rename(tmp_path / "ret")) == "retrieval"
    assert detect_kind(make_sts(tmp_path / "x", "b").rename(tmp_path / "sts")) == "sts"
    assert detect_kind(make_pairs(tmp_path / "x", "c").rename(tmp_path / "pc")) == "pair_classification"
    assert detect_kind(make_classification(tmp_path / "x", "d").rename(tmp_path / "cls")) == "classification"
    assert detect_kind(make_clustering(tmp_path / "x", "e").rename(tmp_path / "clu")) == "clustering"


def test_load_retrieval_folder(data_dir):
    task = loaded(data_dir / "retrieval" / "tinyret")
    assert task.metadata.name == "tinyret" and task.metadata.main_score == "ndcg_at_10"
    split = task.dataset["default"]["test"]
    assert len(split["corpus"]) == 12 and split["corpus"][0]["title"] == "Doc 0"
    assert len(split["queries"]) == 6
    assert split["relevant_docs"]["q3"] == {"d3": 1}


def test_load_sts_classification_clustering_pairs(data_dir):
    sts = loaded(data_dir / "sts" / "tinysts")
    assert sts.metadata.main_score == "cosine_spearman" and len(sts.dataset["test"]) == 11
    cls = loaded(data_dir / "classification" / "tinycls")
    assert cls.metadata.main_score == "accuracy" and set(cls.dataset) == {"train", "test"}
    clu = loaded(data_dir / "clustering" / "tinyclu")
    assert clu.metadata.main_score == "v_measure" and len(clu.dataset["test"][0]["sentences"]) == 12
    pair = loaded(data_dir / "pair_classification" / "tinypair")
    assert pair.metadata.main_score == "max_ap" and pair.dataset["test"]["labels"][:2] == [1, 0]


def test_malformed_file_inside_a_task_is_reported_at_load(data_dir):
    path = data_dir / "sts" / "tinysts" / "test.jsonl"
    lines = path.read_text().splitlines()
    lines[4] = '{"sentence1": "x", "score": 1.0}'
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LocalDataError, match=r"tinysts/test.jsonl:5: missing field 'sentence2'"):
        loaded(path.parent)


def test_missing_files_are_clear_errors(tmp_path):
    folder = make_classification(tmp_path, "nocls")
    (folder / "train.jsonl").unlink()
    with pytest.raises(LocalDataError, match="train.jsonl"):
        load_local_task(folder, kind="classification")
    ret = make_retrieval(tmp_path, "noqueries")
    (ret / "queries.jsonl").unlink()
    task = load_local_task(ret)
    with pytest.raises(LocalDataError, match="missing queries.jsonl"):
        task.load_data()
    with pytest.raises(LocalDataError, match="does not exist"):
        load_local_task(tmp_path / "nowhere")


@pytest.mark.parametrize("n_missing", [6, 4])  # all, and a large share, of the 6 judgements
def test_qrels_pointing_at_missing_documents_fail_at_load(data_dir, n_missing):
    """Issue: qrels whose documents are not in the corpus were scored without a word (NDCG@10 0.00 when all
    were missing)."""
    folder = data_dir / "retrieval" / "tinyret"
    rewrite_qrels(folder, [(f"q{i}", f"doc-{i}" if i < n_missing else f"d{i}") for i in range(6)])
    task = load_local_task(folder)
    with pytest.raises(LocalDataError) as err:
        task.load_data()
    message = str(err.value)
    assert "tinyret" in message and "qrels/test.tsv" in message and "corpus.jsonl.gz" in message
    assert f"{n_missing} of 6" in message and "doc-0" in message and "doc-1" in message


def test_qrels_with_some_missing_documents_warn_with_the_count(data_dir, caplog):
    folder = data_dir / "retrieval" / "tinyret"
    rewrite_qrels(folder, [(f"q{i}", f"d{i}") for i in range(6)] + [("q0", "gone-7")])
    task = load_local_task(folder)
    with caplog.at_level("WARNING", logger="cde_st.data"):
        task.load_data()
    (record,) = [r for r in caplog.records if "gone-7" in r.getMessage()]
    assert "1 of 7" in record.getMessage() and "qrels/test.tsv" in record.getMessage()
    assert task.dataset["default"]["test"]["relevant_docs"]["q0"] == {"d0": 1, "gone-7": 1}


def test_qrels_with_unknown_query_ids(data_dir, caplog):
    folder = data_dir / "retrieval" / "tinyret"
    rewrite_qrels(folder, [(f"q{i}" if i < 2 else f"other-q{i}", f"d{i}") for i in range(6)])
    with pytest.raises(LocalDataError, match=r"qrels/test.tsv.*4 of 6 .*query ids.*queries.jsonl.*other-q2"):
        load_local_task(folder).load_data()
    rewrite_qrels(folder, [(f"q{i}" if i else "lost-q0", f"d{i}") for i in range(6)])
    task = load_local_task(folder)
    with caplog.at_level("WARNING", logger="cde_st.data"):
        task.load_data()
    assert any("1 of 6" in r.getMessage() and "lost-q0" in r.getMessage() for r in caplog.records)
    assert "lost-q0" not in task.dataset["default"]["test"]["relevant_docs"]  # not scored


def test_duplicate_corpus_ids_with_other_texts_fail_naming_both_lines(tmp_path):
    folder = make_retrieval(tmp_path)
    path = folder / "corpus.jsonl.gz"
    rows = [json.loads(line) for line in gzip.open(path, "rt")]
    write_jsonl(path, [*rows, {"_id": "d3", "title": "Doc 3", "text": "a different text"}])
    with pytest.raises(LocalDataError, match=r"corpus.jsonl.gz:13: _id 'd3' is also at line 4 with another text"):
        loaded(folder)
    write_jsonl(path, [*rows, dict(rows[3])])  # an exact repeat is read once
    assert len(loaded(folder).dataset["default"]["test"]["corpus"]) == 12


@pytest.mark.parametrize(
    ("make", "file", "rows", "message"),
    [
        (make_sts, "test.jsonl", [{"sentence1": "a", "sentence2": "b", "score": 3.0}], "at least two pairs"),
        (
            make_sts,
            "test.jsonl",
            [{"sentence1": "a", "sentence2": "b", "score": 3.0}, {"sentence1": "c", "sentence2": "d", "score": 3.0}],
            "every pair has the score 3.0",
        ),
        (make_classification, "train.jsonl", [{"text": f"t{i}", "label": "a"} for i in range(4)], "label 'a'"),
        (make_clustering, "test.jsonl", [{"text": f"t{i}", "label": 1} for i in range(4)], "one cluster"),
        (
            make_pairs,
            "test.jsonl",
            [{"sentence1": f"a{i}", "sentence2": f"b{i}", "label": 1} for i in range(3)],
            "every pair has label 1",
        ),
    ],
)
def test_data_that_cannot_be_scored_names_the_file_and_why(tmp_path, make, file, rows, message):
    """one-label classification or one-pair STS data gave mteb errors (or nan) naming neither."""
    folder = make(tmp_path)
    write_jsonl(folder / file, rows)
    with pytest.raises(LocalDataError, match=f"{folder.name}/{file}: .*{message}"):
        loaded(folder)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_sts_gold_score_that_is_no_finite_number_names_the_record(tmp_path, bad):
    """One NaN gold score made the whole STS score NaN, with no message."""
    folder = make_sts(tmp_path)
    rows = [{"sentence1": f"a{i}", "sentence2": f"b{i}", "score": float(i)} for i in range(6)]
    rows[3]["score"] = bad
    write_jsonl(folder / "test.jsonl", rows)
    with pytest.raises(LocalDataError, match=rf"{folder.name}/test.jsonl:4: score must be a finite number"):
        loaded(folder)


@pytest.mark.parametrize(
    ("make", "file", "line", "field"),
    [
        (make_retrieval, "queries.jsonl", 3, "text"),
        (make_retrieval, "corpus.jsonl.gz", 2, "title"),
        (make_sts, "test.jsonl", 2, "sentence2"),
    ],
    ids=["query", "document_title", "sts_sentence"],
)
def test_unpaired_surrogate_in_eval_data_names_the_file_and_line(tmp_path, make, file, line, field):
    """A JSON escape such as \\ud800 without its pair decodes to a lone surrogate, which no tokenizer or Arrow table
    can encode: the error names the file, the line and the field (it was a bare UnicodeEncodeError)."""
    from evaluation_helpers import write_jsonl

    from cde_st.data import read_jsonl

    folder = make(tmp_path)
    path = folder / file
    fields = {
        "queries.jsonl": ["_id", "text"],
        "corpus.jsonl.gz": ["_id", "text", "title"],
        "test.jsonl": ["sentence1", "sentence2", "score"],
    }[file]
    rows = read_jsonl(path, fields)
    rows[line - 1][field] = "bad \ud800 text"
    write_jsonl(path, rows)
    with pytest.raises(LocalDataError, match=rf"{file}:{line}: field '{field}' holds a lone surrogate"):
        loaded(folder)
