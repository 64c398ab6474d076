"""update_corpus: the folder a full run over the new corpus with the recorded context writes, row for row; bad input
refused before anything in the folder changes."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from corpus_helpers import DOCS, all_rows, write_jsonl

from cde_st.corpus import ForeignOutputError, embed_corpus, read_manifest
from cde_st.corpus.index import build_index, search_index
from cde_st.corpus.update import update_corpus
from cde_st.data import DataError
from cde_st.fingerprints import model_fingerprint


def _changed(i: int) -> dict:
    return {**DOCS[i], "text": f"an edited document {i} about snow"}


NEW = [{"_id": f"n{i}", "title": "topic 9", "text": f"a new document {i} about wind"} for i in range(8)]
CASES = {
    "add": ([*DOCS, *NEW], {"added": 8, "changed": 0, "deleted": 0, "unchanged": 60}),
    "change": ([_changed(i) if i in (3, 30, 59) else d for i, d in enumerate(DOCS)], {"changed": 3, "unchanged": 57}),
    "delete": ([d for i, d in enumerate(DOCS) if i not in (0, 1, 26)], {"deleted": 3, "unchanged": 57}),
    "mixed": (
        [*DOCS[2:20], _changed(20), *NEW[:3], *DOCS[21:], *NEW[3:]],
        {"added": 8, "changed": 1, "deleted": 2, "unchanged": 57},
    ),
    "no-op": (DOCS, {"added": 0, "changed": 0, "deleted": 0, "unchanged": 60}),
}


@pytest.fixture
def embedded(tiny_cde, tmp_path):
    out = tmp_path / "out"
    embed_corpus(tiny_cde, write_jsonl(tmp_path / "v1.jsonl", DOCS), out, shard_size=25, show_progress_bar=False)
    build_index(out, show_progress_bar=False)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_an_update_is_row_for_row_a_full_run_with_the_recorded_context(tiny_cde, embedded, tmp_path, case):
    docs, counts = CASES[case]
    corpus = write_jsonl(tmp_path / "v2.jsonl", docs)
    before = {p.name: p.stat().st_mtime_ns for p in embedded.glob("shard-*")}
    manifest = update_corpus(tiny_cde, corpus, embedded, show_progress_bar=False)
    full = embed_corpus(
        tiny_cde, corpus, tmp_path / "full", context=str(embedded / "context.safetensors"), shard_size=25,
        show_progress_bar=False,
    )  # fmt: skip
    ids, embeddings = all_rows(embedded)
    full_ids, full_embeddings = all_rows(tmp_path / "full")
    assert ids == full_ids == [d["_id"] for d in docs]  # corpus order, cut where a full run cuts
    # Rows embedded in another padded batch than a full run's differ in the last bits only (measured: 7.5e-8).
    np.testing.assert_allclose(embeddings, full_embeddings, rtol=0, atol=1e-6)
    assert [e["rows"] for e in manifest["shards"]] == [e["rows"] for e in full["shards"]]
    assert manifest["context"]["fingerprint"] == full["context"]["fingerprint"]
    last = manifest["history"][-1]
    assert {key: last[key] for key in counts} == counts and last["kind"] == "update"
    assert last["corpus_sha256"] == hashlib.sha256(open(corpus, "rb").read()).hexdigest()
    assert read_manifest(embedded) == manifest and manifest["generation"] == 1
    assert manifest["index"]["rows"] == len(docs)
    hits = search_index(embedded, tiny_cde, ["a new document about wind"], k=len(docs))[0]
    assert sorted(i for i, _ in hits) == sorted(ids)
    names = sorted(p.name for p in embedded.iterdir())
    listed = {e["file"] for e in manifest["shards"]}
    assert {n for n in names if n.startswith("shard-")} == listed  # the files only the old version used are gone
    if case == "no-op":  # nothing to write: the shards and the index are the live ones
        assert before == {p.name: p.stat().st_mtime_ns for p in embedded.glob("shard-*")}
        assert manifest["index"]["file"] == "index.faiss"
    if case == "add":  # the first two shards keep their rows: kept as they are
        assert [e["file"] for e in manifest["shards"][:2]] == ["shard-000000.parquet", "shard-000001.parquet"]


def _snapshot(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_bad_input_is_refused_with_one_message_and_the_folder_unchanged(make_tiny_cde, tiny_cde, embedded, tmp_path):
    before = _snapshot(embedded)
    repeated = write_jsonl(tmp_path / "r.jsonl", [*DOCS, {**NEW[0], "_id": "d7"}])
    with pytest.raises(DataError, match=r"r\.jsonl:61: duplicate id 'd7' \(first at .*r\.jsonl:8\)"):
        update_corpus(tiny_cde, repeated, embedded, show_progress_bar=False)
    assert _snapshot(embedded) == before
    other = make_tiny_cde(context_size=8, seed=1)
    corpus = write_jsonl(tmp_path / "v2.jsonl", [*DOCS, *NEW])
    with pytest.raises(ForeignOutputError, match="model fingerprint") as err:
        update_corpus(other, corpus, embedded, show_progress_bar=False)
    assert read_manifest(embedded)["model"]["identity"] in str(err.value)
    assert model_fingerprint(other, with_context=False) in str(err.value)
    assert _snapshot(embedded) == before
    with pytest.raises(ForeignOutputError, match="stores dtype 'float32'; this run asks for 'int8'"):
        update_corpus(tiny_cde, corpus, embedded, settings={"dtype": "int8"}, show_progress_bar=False)
    with pytest.raises(ForeignOutputError, match="text-field 'text'; this run gives 'body'"):
        update_corpus(tiny_cde, corpus, embedded, reader_options={"text_field": "body"}, show_progress_bar=False)
    assert _snapshot(embedded) == before


def test_a_folder_made_by_another_model_or_by_no_finished_run_is_refused(tiny_cde, tiny_plain, tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS)
    plain = tmp_path / "plain"
    embed_corpus(tiny_plain, corpus, plain, show_progress_bar=False)
    before = _snapshot(plain)
    with pytest.raises(ForeignOutputError, match=r"its model fingerprint is '[0-9a-f]+', this run's is '[0-9a-f]+'"):
        update_corpus(tiny_cde, corpus, plain, show_progress_bar=False)
    assert _snapshot(plain) == before
    with pytest.raises(FileNotFoundError, match="no cde-st-embed folder to update"):
        update_corpus(tiny_cde, corpus, tmp_path / "missing", show_progress_bar=False)
    assert not (tmp_path / "missing").exists()
    manifest = json.loads((plain / "manifest.json").read_text())
    (plain / "manifest.json").write_text(json.dumps({**manifest, "complete": False}))
    with pytest.raises(ValueError, match="its first run has not finished"):
        update_corpus(tiny_plain, corpus, plain, show_progress_bar=False)


def test_a_plain_model_and_int8_storage_update_too(tiny_plain, tmp_path):
    out = tmp_path / "out"
    embed_corpus(tiny_plain, write_jsonl(tmp_path / "v1.jsonl", DOCS), out, dtype="int8", show_progress_bar=False)
    corpus = write_jsonl(tmp_path / "v2.jsonl", [*DOCS[5:], *NEW])
    manifest = update_corpus(tiny_plain, corpus, out, index="none", show_progress_bar=False)
    embed_corpus(tiny_plain, corpus, tmp_path / "full", dtype="int8", show_progress_bar=False)
    ids, embeddings = all_rows(out)
    full_ids, full = all_rows(tmp_path / "full")
    assert ids == full_ids and manifest["drift"] is None and "index" not in manifest
    step = np.abs(full).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(embeddings - full) <= step + 1e-6)  # re-quantised rows: within a step


def _as_written_before_updates(out) -> None:
    """Make a folder look as one written before content hashes, versions and the drift reference existed."""
    import pyarrow.parquet as pq

    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["shards"]:
        path = out / entry["file"]
        pq.write_table(pq.read_table(path).drop(["content_hash"]), path)
        entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        del entry["below"]
    for key in ("drift", "history", "context_file"):
        del manifest[key]
    (out / "drift_reference.safetensors").unlink()
    (out / "manifest.json").write_text(json.dumps(manifest))


def test_a_folder_written_before_content_hashes_is_updated_by_embedding_every_row_again(tiny_cde, embedded, tmp_path):
    _as_written_before_updates(embedded)
    corpus = write_jsonl(tmp_path / "v2.jsonl", [*DOCS, *NEW])
    manifest = update_corpus(tiny_cde, corpus, embedded, show_progress_bar=False)
    last = manifest["history"][-1]
    assert (last["added"], last["changed"], last["unchanged"], last["drift_percent"]) == (8, 60, 0, None)
    full = tmp_path / "full"
    embed_corpus(tiny_cde, corpus, full, context=str(embedded / "context.safetensors"), shard_size=25,
                 show_progress_bar=False)  # fmt: skip
    np.testing.assert_allclose(all_rows(embedded)[1], all_rows(full)[1], rtol=0, atol=1e-6)
    assert manifest["drift"] is None and (embedded / "context.safetensors").is_file()
