"""EmbeddedFolder: a cde-st-embed folder read for a store, its faults named (an unfinished job, a damaged context
file, another model), and texts paired only with the corpus the folder was made from."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from store_helpers import DOCS

from cde_st.corpus import embed_corpus
from cde_st.data import document_text
from cde_st.vector_stores import EmbeddedFolder, ForeignStoreError


def test_rows_are_the_shards_with_the_corpus_texts(embedded):
    rows = list(EmbeddedFolder(embedded).rows())
    assert [len(r.ids) for r in rows] == [8, 8, 8, 6]
    assert [i for r in rows for i in r.ids] == [d["_id"] for d in DOCS]
    assert [t for r in rows for t in r.texts] == [document_text(d["title"], d["text"]) for d in DOCS]
    assert all(r.vectors.shape == (len(r.ids), 32) and r.vectors.dtype == np.float32 for r in rows)


def test_texts_of_a_changed_corpus_are_not_paired(embedded, corpus):
    Path(corpus).write_text(Path(corpus).read_text().replace("note 3 ", "note three "))  # same ids, other text
    assert all(r.texts is None for r in EmbeddedFolder(embedded).rows())
    with pytest.raises(ValueError, match="gone or changed"):
        next(EmbeddedFolder(embedded).rows(with_texts=True))


def test_texts_of_a_deleted_corpus_are_not_paired(embedded, corpus):
    Path(corpus).unlink()
    assert all(r.texts is None for r in EmbeddedFolder(embedded).rows())
    assert all(r.texts is None for r in EmbeddedFolder(embedded).rows(with_texts=False))


def test_an_unfinished_folder_is_refused(embedded):
    manifest_file = Path(embedded) / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["complete"] = False
    manifest_file.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="not finished"):
        EmbeddedFolder(embedded)


def test_a_folder_without_manifest_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no manifest.json"):
        EmbeddedFolder(tmp_path)


def test_a_replaced_context_file_is_refused_naming_both(embedded, tiny_cde, tmp_path):
    folder = EmbeddedFolder(embedded)
    other = embed_corpus(
        tiny_cde, folder.manifest["corpus"]["path"], tmp_path / "other", seed=1, show_progress_bar=False
    )
    (Path(embedded) / "context.safetensors").write_bytes((tmp_path / "other" / "context.safetensors").read_bytes())
    with pytest.raises(ForeignStoreError) as caught:
        folder.context_vectors()
    assert folder.context_fingerprint in str(caught.value) and other["context"]["fingerprint"] in str(caught.value)


def test_the_record_refuses_another_model_naming_both(embedded, make_tiny_cde):
    from cde_st.fingerprints import model_fingerprint

    folder = EmbeddedFolder(embedded)
    other = make_tiny_cde(context_size=8, seed=1)
    with pytest.raises(ForeignStoreError) as caught:
        folder.record(other)
    message = str(caught.value)
    assert folder.manifest["model"]["identity"] in message and model_fingerprint(other, with_context=False) in message


def test_the_record_carries_the_manifests_fingerprints(embedded, tiny_cde):
    folder = EmbeddedFolder(embedded)
    record = folder.record(tiny_cde, model_name="my-model")
    assert record.model_fingerprint == folder.manifest["model"]["identity"]
    assert record.context_fingerprint == folder.context_fingerprint
    assert (record.model_name, record.dimension, record.source) == ("my-model", 32, str(Path(embedded).resolve()))
    assert record.document_prompt == folder.manifest["prompt"]
