"""ContextualEmbeddingFunction on a real local Chroma store (PersistentClient in tmp_path): the configuration carries
the model and the context, Chroma rebuilds the function from it in a fresh process, documents and queries are
embedded as cde-st-embed / cde-st-search do, and another model or context is refused (also after a hand edit, or a
configuration change Chroma itself persists before refusing it)."""

from __future__ import annotations

import json
import sqlite3
import textwrap
from pathlib import Path

import numpy as np
import pytest
from preloaded_python import run_python
from store_helpers import DOCS, embed, write_corpus

pytest.importorskip("chromadb", reason="chromadb is not installed (pip install -e '.[chroma]')")

import chromadb  # noqa: E402
from chromadb.api.shared_system_client import SharedSystemClient  # noqa: E402

from cde_st.corpus.encoders import DocumentEncoder  # noqa: E402
from cde_st.corpus.index import search_index  # noqa: E402
from cde_st.model_loading import load_model  # noqa: E402
from cde_st.vector_stores import EmbeddedFolder, ForeignStoreError  # noqa: E402
from cde_st.vector_stores.chroma_collection import (  # noqa: E402
    FUNCTION_NAME,
    METADATA_KEY,
    ContextualEmbeddingFunction,
    collection_from_folder,
    create_collection,
    open_collection,
    update_collection_from_folder,
)

QUERY = "where does lava come from?"


@pytest.fixture
def saved(make_tiny_cde, tmp_path) -> tuple[str, object]:
    """A tiny contextual model saved to a folder (so Chroma can load it again by name) and loaded from it."""
    folder = str(tmp_path / "tiny-model")
    make_tiny_cde(context_size=8).save(folder)
    return folder, load_model(folder)


@pytest.fixture
def stored(saved, corpus, tmp_path):
    """(model folder, model, embedded folder, Chroma path, collection made from the folder)."""
    model_dir, model = saved
    folder = embed(model, corpus, tmp_path / "corpus-emb", model_name=model_dir)
    path = str(tmp_path / "chroma")
    collection = collection_from_folder(chromadb.PersistentClient(path), "notes", folder, model)
    return model_dir, model, folder, path, collection


def fresh_client(path: str):
    """A client that reads the store from disk again (Chroma caches one system per path in a process)."""
    SharedSystemClient.clear_system_cache()
    return chromadb.PersistentClient(path)


def held(collection) -> dict[str, tuple[np.ndarray, str | None]]:
    data = collection.get(include=["embeddings", "documents"])
    return {
        i: (np.asarray(v, dtype=np.float32), t) for i, v, t in zip(data["ids"], data["embeddings"], data["documents"])
    }


def assert_level(collection, folder) -> None:
    have = held(collection)
    want = {}
    for rows in EmbeddedFolder(folder).rows():
        want.update({i: (v, t) for i, v, t in zip(rows.ids, rows.vectors, rows.texts)})
    assert sorted(have) == sorted(want)
    for doc_id, (vector, text) in want.items():
        # Chroma's cosine space hands vectors back changed by float32 rounding
        assert np.allclose(have[doc_id][0], vector, rtol=0, atol=1e-6), doc_id
        assert have[doc_id][1] == text, doc_id


def test_the_configuration_carries_the_model_and_context(stored):
    model_dir, _, folder, _, collection = stored
    persisted = collection.configuration_json["embedding_function"]
    assert persisted["name"] == FUNCTION_NAME
    record = persisted["config"]["record"]
    manifest = EmbeddedFolder(folder).manifest
    assert record["model_name"] == model_dir
    assert record["model_fingerprint"] == manifest["model"]["identity"]
    assert record["context_fingerprint"] == manifest["context"]["fingerprint"]
    assert json.loads(collection.metadata[METADATA_KEY]) == record
    assert_level(collection, folder)


def test_a_fresh_process_queries_through_chromas_own_rebuild(stored):
    """Chroma rebuilds the function from the stored configuration (the model loaded from its folder) and embeds the
    query with the stored context: the hits of cde-st-search."""
    _, model, folder, path, _ = stored
    script = textwrap.dedent(
        f"""
        import json, chromadb
        import cde_st.vector_stores.chroma_collection  # registers the embedding function with Chroma
        collection = chromadb.PersistentClient({path!r}).get_collection("notes")
        found = collection.query(query_texts=[{QUERY!r}], n_results=5)
        print(json.dumps([found["ids"][0], [1 - d for d in found["distances"][0]]]))
        """
    )
    done = run_python(["-c", script], timeout=300)  # a new process, sentence-transformers imported beforehand
    assert done.returncode == 0, done.stderr[-2000:]
    ids, scores = json.loads(done.stdout.strip().splitlines()[-1])
    expected = search_index(folder, model, [QUERY], k=5)[0]
    assert ids == [i for i, _ in expected]
    assert scores == pytest.approx([s for _, s in expected], abs=1e-4)


def test_open_collection_rebuilds_and_checks_the_function(stored):
    _, model, folder, path, _ = stored
    collection = open_collection(fresh_client(path), "notes")
    found = collection.query(query_texts=[QUERY], n_results=3)
    assert found["ids"][0] == [i for i, _ in search_index(folder, model, [QUERY], k=3)[0]]


def test_documents_and_queries_are_embedded_with_the_prompts_and_context(saved, tmp_path):
    model_dir, model = saved
    texts, ids = [d["text"] for d in DOCS], [d["_id"] for d in DOCS]
    model.set_context(texts, seed=0)
    context = model.contextual_module.context_vectors.detach().numpy()
    function = ContextualEmbeddingFunction(model, model_name=model_dir)
    collection = create_collection(chromadb.PersistentClient(str(tmp_path / "chroma")), "notes", function)
    collection.add(ids=ids, documents=texts)
    with DocumentEncoder(model, context) as encoder:
        want = encoder(texts)
    have = held(collection)
    assert all(np.allclose(have[i][0], v, rtol=0, atol=1e-6) for i, v in zip(ids, want))
    model.clear_context()  # the function keeps its own context
    query = np.asarray(function.embed_query([QUERY])[0])
    direct = model.encode_query([QUERY], context_vectors=context, convert_to_numpy=True)[0]
    assert np.allclose(query, direct / np.linalg.norm(direct), atol=1e-6)


def test_open_refuses_another_context_naming_both(stored):
    from cde_st.context import fingerprint_array

    model_dir, model, _, path, collection = stored
    record = collection.configuration_json["embedding_function"]["config"]["record"]
    other = ContextualEmbeddingFunction(model, np.ones((8, 32), np.float32), model_name=model_dir)
    with pytest.raises(ForeignStoreError) as caught:
        open_collection(fresh_client(path), "notes", other)
    assert record["context_fingerprint"] in str(caught.value)
    assert fingerprint_array(np.ones((8, 32), np.float32)) in str(caught.value)


def test_open_refuses_another_model_naming_both(stored, make_tiny_cde):
    model_dir, model, _, path, collection = stored
    other_model = make_tiny_cde(context_size=8, seed=1)
    other = ContextualEmbeddingFunction(other_model, np.ones((8, 32), np.float32), model_name="other")
    with pytest.raises(ForeignStoreError) as caught:
        open_collection(fresh_client(path), "notes", other)
    assert other.record.model_fingerprint in str(caught.value)
    assert collection.configuration_json["embedding_function"]["config"]["record"]["model_fingerprint"] in str(
        caught.value
    )


def test_a_changed_function_is_refused_by_chroma_and_never_opens(stored):
    """Chroma's own config check (validate_config_update) refuses the change; Chroma 1.5 has persisted it by then,
    and the record kept in the metadata makes open_collection refuse the collection, naming both. (Should a later
    Chroma persist nothing, the collection opens with its own context.)"""
    model_dir, model, _, path, collection = stored
    first = collection.configuration_json["embedding_function"]["config"]["record"]["context_fingerprint"]
    other = ContextualEmbeddingFunction(model, np.ones((8, 32), np.float32), model_name=model_dir)
    with pytest.raises(ValueError, match=first):
        collection.modify(configuration={"embedding_function": other})
    try:
        opened = open_collection(fresh_client(path), "notes")
    except ForeignStoreError as err:
        assert first in str(err) and other.record.context_fingerprint in str(err)
    else:
        assert opened.configuration_json["embedding_function"]["config"]["record"]["context_fingerprint"] == first


def edit_store(path: str, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` in the collection's persisted configuration (schema) and metadata, by hand."""
    SharedSystemClient.clear_system_cache()
    with sqlite3.connect(Path(path) / "chroma.sqlite3") as db:
        db.execute("UPDATE collections SET schema_str = replace(schema_str, ?, ?)", (old, new))
        db.execute("UPDATE collection_metadata SET str_value = replace(str_value, ?, ?)", (old, new))


def test_a_fingerprint_edited_by_hand_is_refused_naming_both(stored):
    _, model, folder, path, collection = stored
    recorded = collection.configuration_json["embedding_function"]["config"]["record"]["context_fingerprint"]
    edit_store(path, recorded, "0123456789abcdef")
    with pytest.raises(ForeignStoreError) as caught:
        open_collection(fresh_client(path), "notes")
    assert recorded in str(caught.value) and "0123456789abcdef" in str(caught.value)
    with pytest.raises(ForeignStoreError, match="0123456789abcdef"):
        open_collection(fresh_client(path), "notes", ContextualEmbeddingFunction.from_folder(folder, model))


def test_a_collection_without_the_function_is_refused(tmp_path, saved):
    client = chromadb.PersistentClient(str(tmp_path / "chroma"))
    client.create_collection("plain")
    with pytest.raises(ForeignStoreError, match="keeps no context"):
        open_collection(client, "plain")


def test_update_from_folder_adds_replaces_and_deletes_by_id(stored, tmp_path):
    model_dir, model, folder, path, collection = stored
    edited = [dict(d) for d in DOCS if d["_id"] != "d5"]
    edited[3]["text"] = "a rewritten note about orbits"
    edited.append({"_id": "d99", "title": "topic 9", "text": "a new note about rain"})
    corpus = write_corpus(tmp_path / "edited.jsonl", edited)
    context_file = str(Path(folder) / "context.safetensors")
    updated = embed(model, corpus, tmp_path / "edited-emb", model_name=model_dir, context=context_file)
    function = ContextualEmbeddingFunction.from_folder(folder, model)
    counts = update_collection_from_folder(collection, updated, function)
    assert counts == {"added": 1, "changed": 1, "deleted": 1, "unchanged": len(DOCS) - 2}
    assert_level(collection, updated)
    other = embed(model, corpus, tmp_path / "other-emb", model_name=model_dir, seed=1)
    with pytest.raises(ForeignStoreError, match=EmbeddedFolder(other).context_fingerprint):
        update_collection_from_folder(collection, other, function)
    assert_level(collection, updated)


def test_a_function_whose_model_cannot_be_loaded_works_in_its_process_and_names_the_model_when_rebuilt(
    make_tiny_cde, tmp_path
):
    model = make_tiny_cde(context_size=8)
    texts, ids = [d["text"] for d in DOCS], [d["_id"] for d in DOCS]
    model.set_context(texts, seed=0)
    function = ContextualEmbeddingFunction(model, model_name=str(tmp_path / "never-saved"))
    collection = create_collection(chromadb.PersistentClient(str(tmp_path / "chroma")), "notes", function)
    collection.add(ids=ids, documents=texts)  # Chroma rebuilds the function here: the one in hand, not a reload
    assert len(collection.query(query_texts=[QUERY], n_results=3)["ids"][0]) == 3
    config = {**collection.configuration_json["embedding_function"]["config"], "batch_size": 7}  # not built yet
    with pytest.raises(FileNotFoundError, match="never-saved"):
        ContextualEmbeddingFunction.build_from_config(config)


def test_update_from_a_folder_updated_in_place_by_cde_st_embed_update(stored, corpus):
    from cde_st.corpus import update_corpus

    model_dir, model, folder, path, collection = stored
    edited = [dict(d) for d in DOCS if d["_id"] != "d5"]
    edited[3]["text"] = "a rewritten note about orbits"
    edited.append({"_id": "d99", "title": "topic 9", "text": "a new note about rain"})
    write_corpus(Path(corpus), edited)
    update_corpus(model, corpus, folder, show_progress_bar=False)
    function = ContextualEmbeddingFunction.from_folder(folder, model)
    counts = update_collection_from_folder(collection, folder, function)
    assert counts == {"added": 1, "changed": 1, "deleted": 1, "unchanged": len(DOCS) - 2}
    assert_level(collection, folder)
    found = open_collection(fresh_client(path), "notes").query(query_texts=[QUERY], n_results=5)
    assert found["ids"][0] == [i for i, _ in search_index(folder, model, [QUERY], k=5)[0]]
