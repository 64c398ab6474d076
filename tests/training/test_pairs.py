"""cde_st.training.pairs: training pairs from jsonl files and folders and BEIR folders; malformed rows name file and
line (``FILE:LINE: ...``, the data layer's format)."""

from __future__ import annotations

import gzip
import json

import pytest

from cde_st.training import TrainConfig, load_pairs


def test_load_pairs_jsonl_domains_exclusion_and_prompts(tmp_path):
    rows_a = [{"query": f"qa{i}", "document": f"da{i}", "domain": "a"} for i in range(5)]
    rows_b = [{"query": f"qb{i}", "document": f"db{i}"} for i in range(3)]  # no domain column: file name
    with gzip.open(tmp_path / "first.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows_a)
    (tmp_path / "second.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows_b))
    cfg = TrainConfig(train_data=[str(tmp_path)], domain_prompts={"second": {"query": "Q: "}})
    pairs = load_pairs(cfg)
    assert len(pairs) == 8 and sorted(set(pairs["domain"])) == ["a", "second"]
    assert "Q: qb0" in pairs["query"]
    pairs = load_pairs(TrainConfig(train_data=[str(tmp_path)], exclude_domains=["a"]))
    assert set(pairs["domain"]) == {"second"}
    pairs = load_pairs(TrainConfig(train_data=[str(tmp_path)], exclude_domains=["first"]))  # by file name
    assert set(pairs["domain"]) == {"second"}
    with pytest.raises(ValueError, match="No training pairs left"):
        load_pairs(TrainConfig(train_data=[str(tmp_path / "second.jsonl")], exclude_domains=["second"]))
    with pytest.raises(FileNotFoundError):
        load_pairs(TrainConfig(train_data=[str(tmp_path / "nope")]))


def test_load_pairs_from_beir_train_qrels(tmp_path):
    beir = tmp_path / "mini_beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "title": f"T{i}", "text": f"text {i}"}) + "\n" for i in range(4))
    )
    (beir / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": f"query {i}"}) + "\n" for i in range(3))
    )
    (beir / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td1\t1\nq1\td2\t1\nq2\td3\t0\n")
    pairs = load_pairs(TrainConfig(train_data=[f"beir:{beir}:train"]))
    assert list(pairs["query"]) == ["query 0", "query 1"]
    assert list(pairs["document"]) == ["T1 text 1", "T2 text 2"]
    assert set(pairs["domain"]) == {"mini_beir_train"}


@pytest.mark.parametrize(
    "bad_line, expected",
    [
        ('{"query": "q2", "document": "d2"', r":3: invalid JSON"),
        ('{"query": "q2"}', r":3: missing field 'document'"),
        ('{"query": 7, "document": "d2"}', r":3: field 'query' must be str, got int 7"),
        ('{"query": "q2", "document": null}', r":3: missing field 'document'"),
        ('{"query": "q2", "document": "d2", "domain": ["x"]}', r":3: field 'domain' must be str"),
        ('["q2", "d2"]', r":3: expected a JSON object, got list"),
    ],
)
@pytest.mark.parametrize("compressed", [False, True])
def test_malformed_jsonl_names_file_and_line(tmp_path, bad_line, expected, compressed):
    import re

    lines = ['{"query": "q0", "document": "d0"}', "", bad_line, '{"query": "q3", "document": "d3"}']
    text = "\n".join(lines) + "\n"
    path = tmp_path / ("pairs.jsonl.gz" if compressed else "pairs.jsonl")
    if compressed:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(str(path)) + expected):
        load_pairs(TrainConfig(train_data=[str(tmp_path)]))


def test_jsonl_with_extra_fields_and_blank_lines_loads(tmp_path):
    rows = ['{"query": "q0", "document": "d0", "score": 1}', "", '{"query": "q1", "document": "d1", "domain": "x"}']
    (tmp_path / "p.jsonl").write_text("\n".join(rows) + "\n")
    pairs = load_pairs(TrainConfig(train_data=[str(tmp_path / "p.jsonl")]))
    assert pairs.column_names == ["query", "document", "domain"]
    assert list(pairs["domain"]) == ["p", "x"] and list(pairs["query"]) == ["q0", "q1"]
    (tmp_path / "broken.jsonl.gz").write_bytes(gzip.compress(b'{"query": "q", "document": "d"}\n' * 50)[:40])
    with pytest.raises(ValueError, match=r"broken\.jsonl\.gz: cannot be read"):
        load_pairs(TrainConfig(train_data=[str(tmp_path / "broken.jsonl.gz")]))


def test_lone_surrogate_in_training_data_names_file_line_and_field(tmp_path):
    from cde_st.training import TrainingDataError

    path = tmp_path / "pairs.jsonl"
    path.write_text('{"query": "q", "document": "d"}\n{"query": "q", "document": "broken \\udc80 text"}\n')
    cfg = TrainConfig(train_data=[str(path)])
    with pytest.raises(TrainingDataError, match=r"pairs.jsonl:2: field 'document' holds a lone surrogate"):
        load_pairs(cfg)


def test_loading_reads_columns_not_rows(tmp_path, monkeypatch):
    """load_pairs' checks read the pairs a column at a time: row by row they took 35 s for 287k pairs."""
    import datasets

    rows = [{"query": f"q{i}", "document": f"d{i}", "domain": "ab"[i % 2]} for i in range(40)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    column_type = type(datasets.Dataset.from_dict({"x": [1]})["x"])
    if column_type is not list:
        monkeypatch.setattr(column_type, "__iter__", lambda self: (_ for _ in ()).throw(AssertionError("row by row")))
    pairs = load_pairs(TrainConfig(train_data=[str(tmp_path)], exclude_domains=["b"]))
    assert len(pairs) == 20


@pytest.mark.parametrize("layout", ["file", "gzip", "folder"])
def test_training_files_that_hold_no_pairs_are_named_as_the_cause(tmp_path, layout):
    """An empty file is the cause, not the domains excluded (there are none)."""
    if layout == "file":
        (tmp_path / "empty.jsonl").write_text("")
        source, named = tmp_path / "empty.jsonl", [tmp_path / "empty.jsonl"]
    elif layout == "gzip":
        with gzip.open(tmp_path / "empty.jsonl.gz", "wt") as f:
            f.write("\n  \n")  # blank lines only
        source, named = tmp_path / "empty.jsonl.gz", [tmp_path / "empty.jsonl.gz"]
    else:
        (tmp_path / "a.jsonl").write_text("")
        (tmp_path / "b.jsonl").write_text("")
        source, named = tmp_path, [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    with pytest.raises(ValueError) as err:
        load_pairs(TrainConfig(train_data=[str(source)]))
    message = str(err.value)
    assert "excluding" not in message
    assert all(str(path) in message for path in named) and "no pairs" in message, message


def test_an_empty_file_beside_one_with_pairs_only_warns(tmp_path, caplog):
    (tmp_path / "empty.jsonl").write_text("")
    rows = [{"query": f"q{i}", "document": f"d{i}"} for i in range(4)]
    (tmp_path / "full.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level("WARNING"):
        assert len(load_pairs(TrainConfig(train_data=[str(tmp_path)]))) == 4
    assert "empty.jsonl holds no pairs" in caplog.text


def test_the_train_command_over_an_empty_file_says_the_file_holds_no_pairs(tmp_path, capsys):
    from cde_st.cli import train_run

    (tmp_path / "empty.jsonl").write_text("")
    argv = ["--preset", "tiny", "--output-dir", str(tmp_path / "run"), "--set", f"train_data={tmp_path}/empty.jsonl"]
    assert train_run(argv) == 2
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and f"{tmp_path}/empty.jsonl holds no pairs" in error[0], error
