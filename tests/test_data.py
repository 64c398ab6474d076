"""The data layer (cde_st.data): the validating JSONL and qrels readers, BEIR folders, the document text rule."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from cde_st.data import DataError, document_text, load_beir, read_jsonl, read_qrels


@pytest.mark.parametrize(
    ("content", "fields", "message"),
    [
        ('{"text": "a", "label": 1}\n{"text": "b", "label": 2\n', ["text", "label"], ":2: invalid JSON"),
        ('{"text": "a", "label": 1}\n\n{"label": 2}\n', ["text", "label"], ":3: missing field 'text'"),
        (
            '{"sentence1": "a", "sentence2": "b", "score": "high"}\n',
            ["sentence1", "sentence2", "score"],
            ":1: field 'score'",
        ),
        ("[1, 2]\n", ["text"], ":1: expected a JSON object"),
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path, content, fields, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match="bad.jsonl" + message.replace("(", r"\(")):
        read_jsonl(path, fields)


def test_malformed_qrels_and_truncated_gzip(tmp_path):
    path = tmp_path / "test.tsv"
    path.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\n")
    with pytest.raises(DataError, match=r"test.tsv:3: expected 3"):
        read_qrels(path)
    path.write_text("query-id\tcorpus-id\tscore\nq1\td1\tyes\n")
    with pytest.raises(DataError, match=r"test.tsv:2: relevance score 'yes'"):
        read_qrels(path)
    gz = tmp_path / "corpus.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"_id": "1", "text": "x"}\n' * 50)[:30])
    with pytest.raises(DataError, match="corpus.jsonl.gz"):
        read_jsonl(gz, ["_id", "text"])


def _qrels(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "test.tsv"
    path.write_text(text)
    return path


def test_fractional_or_infinite_grades_are_errors_naming_file_and_line(tmp_path):
    with pytest.raises(DataError, match=r"test.tsv:3: relevance score '0.5' is fractional"):
        read_qrels(_qrels(tmp_path, "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0.5\n"))
    with pytest.raises(DataError, match=r"test.tsv:2: relevance score 'inf' is not a finite number"):
        read_qrels(_qrels(tmp_path, "q1\td1\t1\nq1\td2\tinf\n"))
    assert read_qrels(_qrels(tmp_path, "q1\td1\t2.0\n")) == {"q1": {"d1": 2}}  # an integral float is its integer


def test_duplicate_judgements(tmp_path, caplog):
    with pytest.raises(DataError, match=r"test.tsv:4: query 'q1', document 'd1' is judged 2 here and 1 at line 2"):
        read_qrels(_qrels(tmp_path, "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td1\t1\nq1\td1\t2\n"))
    with caplog.at_level("WARNING", logger="cde_st.data"):
        assert read_qrels(_qrels(tmp_path, "q1\td1\t1\nq1\td1\t1\n")) == {"q1": {"d1": 1}}
    assert "repeated with the same grade" in caplog.text


def test_only_the_beir_header_is_skipped(tmp_path):
    with pytest.raises(DataError, match=r"test.tsv:1: relevance score 'relevance' is not a number"):
        read_qrels(_qrels(tmp_path, "qid\tdocid\trelevance\nq1\td1\t1\n"))
    with pytest.raises(DataError, match=r"test.tsv:1: relevance score 'x' is not a number"):
        read_qrels(_qrels(tmp_path, "q0\td0\tx\nq1\td1\t1\n"))  # a broken first judgement is not a header
    assert read_qrels(_qrels(tmp_path, "query-id\tcorpus-id\tscore\nq1\td1\t1\n")) == {"q1": {"d1": 1}}


def test_queries_judged_only_non_relevant_are_left_out_with_a_warning(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="cde_st.data"):
        qrels = read_qrels(_qrels(tmp_path, "q1\td1\t1\nq2\td1\t0\nq2\td2\t-1\n"))
    assert qrels == {"q1": {"d1": 1}}
    assert "1 of 2 judged queries have no document graded above 0" in caplog.text and "'q2'" in caplog.text
    with pytest.raises(DataError, match="no judgement has a grade above 0"):
        read_qrels(_qrels(tmp_path, "q1\td1\t0\n"))


# ------------------------------------------------------------------------------------------------------------
# BEIR folders and the document text rule


def _beir_folder(root: Path) -> Path:
    folder = root / "toy"
    (folder / "qrels").mkdir(parents=True)
    corpus = [{"_id": "d1", "title": "Rain", "text": "falls from clouds."}, {"_id": 2, "text": " no title "}]
    corpus.append({"_id": "d3", "title": None, "text": "a null title"})
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    queries = [{"_id": "q1", "text": "why rain?"}, {"_id": "q2", "text": "unjudged"}, {"_id": "q3", "text": "x"}]
    with gzip.open(folder / "queries.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in queries))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq3\t2\t2\nq3\td3\t0\n")
    return folder


def test_load_beir_reads_a_split_with_string_ids_and_judged_queries(tmp_path):
    split = load_beir(_beir_folder(tmp_path), "test")
    assert split.corpus == {
        "d1": {"title": "Rain", "text": "falls from clouds."},
        "2": {"title": "", "text": " no title "},
        "d3": {"title": "", "text": "a null title"},
    }
    assert split.queries == {"q1": "why rain?", "q3": "x"}  # only judged queries, as beir's loader
    assert split.qrels == {"q1": {"d1": 1}, "q3": {"2": 2, "d3": 0}}
    assert split.document_texts() == {"d1": "Rain falls from clouds.", "2": "no title", "d3": "a null title"}


def test_load_beir_errors_name_the_folder_and_file(tmp_path):
    folder = _beir_folder(tmp_path)
    with pytest.raises(DataError, match=r"missing qrels/dev.tsv \(found: \['test'\]\)"):
        load_beir(folder, "dev")
    (folder / "queries.jsonl.gz").unlink()
    with pytest.raises(DataError, match="missing queries.jsonl"):
        load_beir(folder, "test")


def test_document_text_is_title_then_text_stripped():
    assert document_text("Rain", "falls.") == "Rain falls."
    assert document_text("", " text ") == document_text(None, " text ") == "text"
    assert document_text("  ", "text") == "text"


def test_local_data_error_is_the_data_error():
    from cde_st.evaluation import LocalDataError

    assert LocalDataError is DataError and issubclass(DataError, ValueError)


def test_one_data_error_class_under_its_older_names():
    """The training pairs and the eval kit's local tasks raise the data layer's DataError; their old names alias it."""
    from cde_st.data import DataError
    from cde_st.evaluation.local_tasks import LocalDataError
    from cde_st.training import TrainingDataError

    assert LocalDataError is DataError and TrainingDataError is DataError


def test_column_reads_a_dataset_column_in_one_piece_in_its_row_order(monkeypatch):
    import datasets

    from cde_st.data import column

    ds = datasets.Dataset.from_dict({"text": [f"t{i}" for i in range(50)], "n": list(range(50))})
    view = ds.filter(lambda n: n % 3 != 0, input_columns=["n"]).shuffle(seed=1)  # an indices mapping
    expected = [row["text"] for row in view]
    column_type = type(view["text"])
    if column_type is not list:  # datasets >= 4: a lazy Column, whose row-by-row iteration is what must not run
        monkeypatch.setattr(column_type, "__iter__", lambda self: (_ for _ in ()).throw(AssertionError("row by row")))
    assert column(view, "text") == expected


def test_column_of_a_dict_of_lists_is_a_copy():
    from cde_st.data import column

    data = {"text": ["a", "b"]}
    values = column(data, "text")
    values.append("c")
    assert data["text"] == ["a", "b"] and values == ["a", "b", "c"]


def test_as_list_slices_a_column_and_lists_anything_else():
    import datasets

    from cde_st.data import as_list

    ds = datasets.Dataset.from_dict({"n": [3, 1, 2]}).sort("n")
    assert as_list(ds["n"]) == [1, 2, 3] and as_list((1, 2)) == [1, 2] and as_list(x for x in "ab") == ["a", "b"]
