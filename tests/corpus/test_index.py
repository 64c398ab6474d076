"""The index beside the shards, and search with the corpus's model and context; the two commands end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from corpus_helpers import DOCS, TEXTS, all_rows

from cde_st.corpus import ForeignOutputError, embed_corpus, read_context_file, read_manifest
from cde_st.corpus.commands import embed_main, search_main
from cde_st.corpus.index import build_index, choose_index, search_index


def test_index_choice_follows_the_corpus_size():
    assert choose_index(10_000, 384)["kind"] == "flat"
    ivf = choose_index(1_000_000, 384)
    assert ivf["kind"] == "ivf" and ivf["factory"] == "IVF4000,Flat" and ivf["nprobe"] == 1000
    assert choose_index(10_000_000, 384)["factory"] == "IVF12649,PQ96"
    assert choose_index(500, 32, "ivf")["nlist"] == 12  # never fewer than 39 training vectors a list


@pytest.mark.parametrize("kind", ["flat", "ivf"])
def test_search_finds_what_exact_search_over_the_shards_finds(tiny_cde, corpus_file, tmp_path, kind):
    embed_corpus(tiny_cde, corpus_file, tmp_path / "out", shard_size=25, show_progress_bar=False)
    record = build_index(tmp_path / "out", kind=kind, show_progress_bar=False)
    assert read_manifest(tmp_path / "out")["index"] == record and record["rows"] == 60
    queries = ["rain clouds", "sun 3"]
    hits = search_index(tmp_path / "out", tiny_cde, queries, k=5, nprobe=record["nlist"])
    ids, corpus = all_rows(tmp_path / "out")
    vectors = read_context_file(tmp_path / "out" / "context.safetensors").vectors
    q = tiny_cde.encode_query(queries, context_vectors=torch.tensor(vectors))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    scores = q @ (corpus / np.linalg.norm(corpus, axis=1, keepdims=True)).T
    for row, found in zip(scores, hits):
        assert [i for i, _ in found] == [ids[j] for j in np.argsort(-row, kind="stable")[:5]]
        np.testing.assert_allclose([s for _, s in found], np.sort(row)[::-1][:5], atol=1e-5)


def test_search_refuses_another_model_or_context_naming_both_fingerprints(make_tiny_cde, corpus_file, tmp_path):
    model = make_tiny_cde(context_size=8)
    manifest = embed_corpus(model, corpus_file, tmp_path / "out", show_progress_bar=False)
    build_index(tmp_path / "out", show_progress_bar=False)
    other = make_tiny_cde(context_size=8, seed=1)
    with pytest.raises(ForeignOutputError, match=manifest["model"]["identity"]):
        search_index(tmp_path / "out", other, ["rain"])
    wrong = np.zeros((8, 32), dtype=np.float32)
    with pytest.raises(ForeignOutputError, match=manifest["context"]["fingerprint"]):
        search_index(tmp_path / "out", model, ["rain"], context=wrong)


def test_the_commands_embed_index_and_search(make_tiny_cde, corpus_file, tmp_path, capsys):
    make_tiny_cde(context_size=8).save(str(tmp_path / "model"))
    out = tmp_path / "out"
    embed_main(
        [
            str(tmp_path / "model"),
            corpus_file,
            "--out",
            str(out),
            "--shard-size",
            "25",
            "--max-seq-length",
            "16",
            "--quiet",
        ]
    )
    printed = capsys.readouterr().out
    assert "Embedded 60 documents into 3 shards" in printed and "Index: flat" in printed
    assert [i for i in all_rows(out)[0]] == [d["_id"] for d in DOCS]
    assert read_manifest(out)["max_seq_length"] == 16
    search_main([str(out), TEXTS[3], "-k", "3", "--json"])  # the manifest's model, at the manifest's max length
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert len(hits) == 3 and hits[0]["score"] >= hits[1]["score"]
