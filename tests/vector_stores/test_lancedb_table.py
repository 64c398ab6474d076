"""ContextualLanceTable on a real local LanceDB database: made from an embedded folder or from texts, searched with
the folder's context, refusing another model or context (also after a hand edit), and brought level with a folder
changed by a later cde-st-embed run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from store_helpers import DOCS, embed, write_corpus

pytest.importorskip("lancedb", reason="lancedb is not installed (pip install -e '.[lancedb]')")

from cde_st.corpus.index import search_index  # noqa: E402
from cde_st.data import document_text  # noqa: E402
from cde_st.vector_stores import ContextualLanceTable, EmbeddedFolder, ForeignStoreError  # noqa: E402
from cde_st.vector_stores.lancedb_table import CONTEXT_TABLE_SUFFIX, RECORD_KEY  # noqa: E402

QUERY = "where does lava come from?"


def table_rows(store) -> dict[str, tuple[np.ndarray, str | None]]:
    data = store.table.to_arrow()
    vectors = np.asarray(data.column("vector").to_pylist(), dtype=np.float32)
    texts = data.column("text").to_pylist() if "text" in data.column_names else [None] * len(vectors)
    return {i: (v, t) for i, v, t in zip(data.column("id").to_pylist(), vectors, texts)}


def folder_rows(folder) -> dict[str, tuple[np.ndarray, str | None]]:
    rows = {}
    for part in EmbeddedFolder(folder).rows():
        texts = part.texts or [None] * len(part.ids)
        rows.update({i: (v, t) for i, v, t in zip(part.ids, part.vectors, texts)})
    return rows


def assert_level(store, folder) -> None:
    have, want = table_rows(store), folder_rows(folder)
    assert sorted(have) == sorted(want)
    for doc_id, (vector, text) in want.items():
        assert np.array_equal(have[doc_id][0], vector), doc_id
        assert have[doc_id][1] == text, doc_id


def edit_record(db, name: str, **changes) -> None:
    """Change the stored record's fields by hand, as a user with LanceDB alone could."""
    import lancedb

    table = lancedb.connect(str(db)).open_table(name)
    record = json.loads(table.schema.field("vector").metadata[RECORD_KEY.encode()])
    table.update_field_metadata({"path": "vector", "metadata": {RECORD_KEY: json.dumps({**record, **changes})}})


def test_from_folder_holds_the_folders_rows_and_searches_as_cde_st_search(embedded, tiny_cde, tmp_path):
    db = tmp_path / "lancedb"
    store = ContextualLanceTable.from_folder(db, "notes", embedded, tiny_cde)
    assert len(store) == len(DOCS)
    assert_level(store, embedded)
    texts = {d["_id"]: document_text(d["title"], d["text"]) for d in DOCS}
    assert {i: t for i, (_, t) in table_rows(store).items()} == texts  # the corpus's texts, paired by id

    reopened = ContextualLanceTable.open(db, "notes", tiny_cde)
    hits = reopened.search(QUERY, k=5)
    expected = search_index(embedded, tiny_cde, [QUERY], k=5)[0]
    assert [h["id"] for h in hits] == [i for i, _ in expected]
    assert [h["score"] for h in hits] == pytest.approx([s for _, s in expected], abs=1e-5)
    assert hits[0]["text"] == texts[hits[0]["id"]]


def test_the_search_reads_the_tables_context_not_the_models_active_one(embedded, tiny_cde, tmp_path):
    db = tmp_path / "lancedb"
    ContextualLanceTable.from_folder(db, "notes", embedded, tiny_cde)
    expected = search_index(embedded, tiny_cde, [QUERY], k=5)[0]
    tiny_cde.set_context([d["text"] for d in DOCS[:8]])  # another context active in the caller's model
    hits = ContextualLanceTable.open(db, "notes", tiny_cde).search(QUERY, k=5)
    assert [h["score"] for h in hits] == pytest.approx([s for _, s in expected], abs=1e-5)


def test_the_search_with_the_tables_context_active_in_the_model_gives_the_same_hits(embedded, tiny_cde, tmp_path):
    import torch

    store = ContextualLanceTable.from_folder(tmp_path / "lancedb", "notes", embedded, tiny_cde)
    tiny_cde.set_context(torch.as_tensor(store.context))  # queries then read the active context as it is
    hits = store.search(QUERY, k=5)
    expected = search_index(embedded, tiny_cde, [QUERY], k=5)[0]
    assert [h["id"] for h in hits] == [i for i, _ in expected]
    assert [h["score"] for h in hits] == pytest.approx([s for _, s in expected], abs=1e-5)


def test_open_refuses_another_model_naming_both_fingerprints(embedded, tiny_cde, make_tiny_cde, tmp_path):
    from cde_st.fingerprints import model_fingerprint

    db = tmp_path / "lancedb"
    ContextualLanceTable.from_folder(db, "notes", embedded, tiny_cde)
    other = make_tiny_cde(context_size=8, seed=1)
    with pytest.raises(ForeignStoreError) as caught:
        ContextualLanceTable.open(db, "notes", other)
    message = str(caught.value)
    assert model_fingerprint(tiny_cde, with_context=False) in message
    assert model_fingerprint(other, with_context=False) in message


def test_open_refuses_another_context_naming_both(embedded, tiny_cde, tmp_path):
    from cde_st.context import fingerprint_array

    db = tmp_path / "lancedb"
    store = ContextualLanceTable.from_folder(db, "notes", embedded, tiny_cde)
    other = store.context + 1.0
    with pytest.raises(ForeignStoreError) as caught:
        ContextualLanceTable.open(db, "notes", tiny_cde, context=other)
    assert store.record.context_fingerprint in str(caught.value) and fingerprint_array(other) in str(caught.value)


@pytest.mark.parametrize("field", ["context_fingerprint", "model_fingerprint"])
def test_a_record_edited_by_hand_is_refused_naming_both(embedded, tiny_cde, tmp_path, field):
    db = tmp_path / "lancedb"
    store = ContextualLanceTable.from_folder(db, "notes", embedded, tiny_cde)
    edit_record(db, "notes", **{field: "0123456789abcdef"})
    with pytest.raises(ForeignStoreError) as caught:
        ContextualLanceTable.open(db, "notes", tiny_cde)
    assert "0123456789abcdef" in str(caught.value) and getattr(store.record, field) in str(caught.value)


def test_a_context_table_replaced_by_hand_is_refused(embedded, tiny_cde, tmp_path):
    import lancedb

    db = tmp_path / "lancedb"
    store = ContextualLanceTable.from_folder(db, "notes", embedded, tiny_cde)
    context_table = lancedb.connect(str(db)).open_table("notes" + CONTEXT_TABLE_SUFFIX)
    context_table.delete("position = 3")  # one context vector fewer
    with pytest.raises(ForeignStoreError, match=store.record.context_fingerprint):
        ContextualLanceTable.open(db, "notes", tiny_cde)


def test_a_table_without_a_record_is_refused(tmp_path, tiny_cde):
    import lancedb

    lancedb.connect(str(tmp_path / "lancedb")).create_table("plain", data=[{"id": "a", "vector": [0.0, 1.0]}])
    with pytest.raises(ForeignStoreError, match="no cde_st store record"):
        ContextualLanceTable.open(tmp_path / "lancedb", "plain", tiny_cde)


def test_create_from_texts_add_replace_and_delete(tiny_cde, tmp_path):
    from cde_st.corpus.encoders import DocumentEncoder

    texts = [d["text"] for d in DOCS]
    tiny_cde.set_context(texts, seed=0)
    context = tiny_cde.contextual_module.context_vectors.detach().numpy()
    ids = [d["_id"] for d in DOCS]
    store = ContextualLanceTable.create(tmp_path / "db", "notes", tiny_cde, ids, texts, model_name="tiny")
    with DocumentEncoder(tiny_cde, context) as encoder:
        want = encoder(texts)
    rows = table_rows(store)
    assert all(np.array_equal(rows[i][0], v) for i, v in zip(ids, want))

    store.add(["d1", "new"], ["a rewritten note about lava", "a new note about bread"])
    store.delete(["d2", "it's absent"])
    rows = table_rows(store)
    assert len(rows) == len(DOCS) and "d2" not in rows and rows["d1"][1] == "a rewritten note about lava"
    with DocumentEncoder(tiny_cde, context) as encoder:  # the same batch as add's: the same padding
        assert np.array_equal(rows["new"][0], encoder(["a rewritten note about lava", "a new note about bread"])[1])
    assert ContextualLanceTable.open(tmp_path / "db", "notes", tiny_cde).search("lava", k=1)[0]["id"] in rows


def test_create_needs_a_context_for_a_contextual_model(tiny_cde, tmp_path):
    tiny_cde.clear_context()
    with pytest.raises(ValueError, match="set_context"):
        ContextualLanceTable.create(tmp_path / "db", "notes", tiny_cde, ["a"], ["text"], model_name="tiny")


def test_update_from_folder_adds_replaces_and_deletes_by_id(embedded, tiny_cde, tmp_path):
    db = tmp_path / "lancedb"
    store = ContextualLanceTable.from_folder(db, "notes", embedded, tiny_cde)
    edited = [dict(d) for d in DOCS if d["_id"] != "d5"]  # deleted
    edited[3]["text"] = "a rewritten note about orbits"  # d3 changed
    edited.append({"_id": "d99", "title": "topic 9", "text": "a new note about rain"})  # added
    corpus = write_corpus(tmp_path / "edited.jsonl", edited)
    context_file = str(Path(embedded) / "context.safetensors")  # the same context, as an update keeps it
    updated = embed(tiny_cde, corpus, tmp_path / "edited-emb", context=context_file)

    counts = store.update_from_folder(updated)
    assert counts == {"added": 1, "changed": 1, "deleted": 1, "unchanged": len(DOCS) - 2}
    assert_level(store, updated)
    reopened = ContextualLanceTable.open(db, "notes", tiny_cde)
    assert [h["id"] for h in reopened.search(QUERY, k=5)] == [
        i for i, _ in search_index(updated, tiny_cde, [QUERY], 5)[0]
    ]
    again = reopened.update_from_folder(updated)
    assert again == {"added": 0, "changed": 0, "deleted": 0, "unchanged": len(edited)}


def test_update_from_a_folder_with_another_context_is_refused_and_changes_nothing(embedded, tiny_cde, corpus, tmp_path):
    store = ContextualLanceTable.from_folder(tmp_path / "lancedb", "notes", embedded, tiny_cde)
    version = store.table.version
    other = embed(tiny_cde, corpus, tmp_path / "other-emb", seed=1)  # another sample: another context
    with pytest.raises(ForeignStoreError) as caught:
        store.update_from_folder(other)
    assert store.record.context_fingerprint in str(caught.value)
    assert EmbeddedFolder(other).context_fingerprint in str(caught.value)
    assert store.table.version == version


def test_a_plain_model_needs_no_context(tiny_plain_model, corpus, tmp_path):
    folder = embed(tiny_plain_model, corpus, tmp_path / "plain-emb")
    store = ContextualLanceTable.from_folder(tmp_path / "db", "plain", folder, tiny_plain_model)
    assert store.record.context_fingerprint is None
    hits = ContextualLanceTable.open(tmp_path / "db", "plain", tiny_plain_model).search(QUERY, k=3)
    assert [h["id"] for h in hits] == [i for i, _ in search_index(folder, tiny_plain_model, [QUERY], k=3)[0]]


def test_from_folder_with_another_model_makes_nothing(embedded, make_tiny_cde, tmp_path):
    import lancedb

    with pytest.raises(ForeignStoreError, match="was embedded by model"):
        ContextualLanceTable.from_folder(tmp_path / "db", "notes", embedded, make_tiny_cde(context_size=8, seed=1))
    assert lancedb.connect(str(tmp_path / "db")).list_tables().tables == []


def test_a_second_table_of_the_same_name_is_refused_and_the_first_kept(embedded, tiny_cde, corpus, tmp_path):
    first = ContextualLanceTable.from_folder(tmp_path / "db", "notes", embedded, tiny_cde)
    other = embed(tiny_cde, corpus, tmp_path / "other-emb", seed=1)
    with pytest.raises(ValueError, match="already exists"):
        ContextualLanceTable.from_folder(tmp_path / "db", "notes", other, tiny_cde)
    reopened = ContextualLanceTable.open(tmp_path / "db", "notes", tiny_cde)
    assert reopened.record == first.record and np.array_equal(reopened.context, first.context)


def test_bad_arguments_are_refused(embedded, tiny_cde, tmp_path):
    store = ContextualLanceTable.from_folder(tmp_path / "db", "notes", embedded, tiny_cde)
    with pytest.raises(ValueError, match="2 ids for 1 texts"):
        store.add(["a", "b"], ["one text"])
    with pytest.raises(ValueError, match="ids repeat"):
        store.add(["a", "a"], ["one", "two"])
    with pytest.raises(ValueError, match="k must be at least 1"):
        store.search(QUERY, k=0)
    assert len(store) == len(DOCS)


def edited_folder(model, folder, tmp_path) -> str:
    """The corpus of ``folder`` with d5 deleted, d3 changed and d99 added, embedded with the folder's context."""
    edited = [dict(d) for d in DOCS if d["_id"] != "d5"]
    edited[3]["text"] = "a rewritten note about orbits"
    edited.append({"_id": "d99", "title": "topic 9", "text": "a new note about rain"})
    corpus = write_corpus(tmp_path / "edited.jsonl", edited)
    return embed(model, corpus, tmp_path / "edited-emb", context=str(Path(folder) / "context.safetensors"))


def test_an_update_interrupted_before_its_deletes_is_finished_by_the_same_call(embedded, tiny_cde, tmp_path):
    store = ContextualLanceTable.from_folder(tmp_path / "lancedb", "notes", embedded, tiny_cde)
    updated = edited_folder(tiny_cde, embedded, tmp_path)
    delete = store.table.delete
    store.table.delete = lambda where: (_ for _ in ()).throw(KeyboardInterrupt)  # killed before the deletes
    with pytest.raises(KeyboardInterrupt):
        store.update_from_folder(updated)
    store.table.delete = delete
    again = ContextualLanceTable.open(tmp_path / "lancedb", "notes", tiny_cde)
    assert again.update_from_folder(updated) == {"added": 0, "changed": 0, "deleted": 1, "unchanged": len(DOCS)}
    assert_level(again, updated)


def test_a_table_made_from_a_folder_interrupted_is_finished_by_an_update(embedded, tiny_cde, tmp_path, monkeypatch):
    from lancedb.table import LanceTable

    add, calls = LanceTable.add, []

    def add_then_stop(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # killed after the first shard
            raise KeyboardInterrupt
        return add(self, *args, **kwargs)

    monkeypatch.setattr(LanceTable, "add", add_then_stop)
    with pytest.raises(KeyboardInterrupt):
        ContextualLanceTable.from_folder(tmp_path / "lancedb", "notes", embedded, tiny_cde)
    monkeypatch.setattr(LanceTable, "add", add)
    store = ContextualLanceTable.open(tmp_path / "lancedb", "notes", tiny_cde)
    assert len(store) == 8
    assert store.update_from_folder(embedded) == {"added": len(DOCS) - 8, "changed": 0, "deleted": 0, "unchanged": 8}
    assert_level(store, embedded)


def test_a_folder_with_an_empty_shard_makes_and_updates_a_table(tiny_cde, tmp_path):
    docs = [{"_id": d["_id"]} if 8 <= n < 16 else d for n, d in enumerate(DOCS)]  # shard 1: no text, no valid record
    corpus = write_corpus(tmp_path / "gappy.jsonl", docs)
    folder = embed(tiny_cde, corpus, tmp_path / "gappy-emb", skip_invalid=True)
    assert [e["rows"] for e in EmbeddedFolder(folder).manifest["shards"]] == [8, 0, 8, 6]
    store = ContextualLanceTable.from_folder(tmp_path / "db", "notes", folder, tiny_cde)
    assert len(store) == len(DOCS) - 8
    assert store.update_from_folder(folder) == {"added": 0, "changed": 0, "deleted": 0, "unchanged": len(DOCS) - 8}


def test_update_from_a_folder_updated_in_place_by_cde_st_embed_update(embedded, tiny_cde, corpus, tmp_path):
    from cde_st.corpus import update_corpus

    store = ContextualLanceTable.from_folder(tmp_path / "lancedb", "notes", embedded, tiny_cde)
    edited = [dict(d) for d in DOCS if d["_id"] not in ("d5", "d6")]
    edited[3]["text"] = "a rewritten note about orbits"
    edited.append({"_id": "d99", "title": "topic 9", "text": "a new note about rain"})
    write_corpus(Path(corpus), edited)  # the corpus edited in place, as cde-st-embed --update expects
    update_corpus(tiny_cde, corpus, embedded, show_progress_bar=False)
    counts = store.update_from_folder(embedded)
    assert counts == {"added": 1, "changed": 1, "deleted": 2, "unchanged": len(DOCS) - 3}
    assert_level(store, embedded)
    hits = ContextualLanceTable.open(tmp_path / "lancedb", "notes", tiny_cde).search(QUERY, k=5)
    assert [h["id"] for h in hits] == [i for i, _ in search_index(embedded, tiny_cde, [QUERY], k=5)[0]]


def test_a_folder_given_a_new_context_is_refused_naming_both(embedded, tiny_cde, corpus, tmp_path):
    from cde_st.corpus import recontextualize_corpus

    store = ContextualLanceTable.from_folder(tmp_path / "lancedb", "notes", embedded, tiny_cde)
    recontextualize_corpus(tiny_cde, corpus, embedded, seed=1, show_progress_bar=False)
    with pytest.raises(ForeignStoreError) as caught:
        store.update_from_folder(embedded)
    assert store.record.context_fingerprint in str(caught.value)
    assert EmbeddedFolder(embedded).context_fingerprint in str(caught.value)
