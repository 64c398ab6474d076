"""The context store: names, atomic checksummed files, start-up loading, damaged files, model identity, several
stores (replicas) sharing one state directory; and, through real server processes, restart (same fingerprints,
bit-identical embeddings) and SIGKILL in the middle of a context write."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from sample_texts import SHORT_DOCS, TOPIC_DOCS
from serving_helpers import API_KEY, Server

from cde_st.context_errors import (
    ContextBusy,
    ContextDamaged,
    ContextExists,
    ContextModelMismatch,
    ContextNotFound,
    ContextReserved,
    InvalidContextName,
    StateDirError,
)
from cde_st.serving import contexts
from cde_st.serving.contexts import DEFAULT_NAME, PAUSE_ENV, ContextStore, StoredContext, check_name


def context(name: str, seed: int = 0, identity: str = "model-a", rows: int = 4) -> StoredContext:
    vectors = torch.from_numpy(np.random.default_rng(seed).standard_normal((rows, 6)).astype(np.float32))
    return StoredContext(name, f"fp-{name}-{seed}", rows, seed, vectors, identity, corpus_size=10)


def put(store: ContextStore, ctx: StoredContext, replace: bool = False) -> None:
    store.reserve(ctx.name, replace)
    store.commit(ctx)


@pytest.mark.parametrize("name", ["a", "Z9", "scifact-2024.v1_test", "x" * 64, "1.2"])
def test_valid_names(name):
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "a..b", ".hidden", "-x", "a/b", "a\\b", "x" * 65, "a b", "é", None])
def test_invalid_names(name):
    with pytest.raises(InvalidContextName) as error:
        check_name(name)
    assert error.value.param == "name"


def test_contexts_survive_a_new_store_bit_for_bit(tmp_path):
    store = ContextStore(tmp_path, "model-a")
    put(store, context("alpha"))
    put(store, context("beta", seed=1))
    files = sorted(p.name for p in (tmp_path / "contexts").iterdir())
    assert files == ["alpha.safetensors", "beta.safetensors"]
    del store  # the state-dir lock goes with the store's lock file
    again = ContextStore(tmp_path, "model-a")
    for name, seed in [("alpha", 0), ("beta", 1)]:
        loaded, made = again.get(name), context(name, seed)
        assert (loaded.fingerprint, loaded.size, loaded.seed, loaded.corpus_size) == (made.fingerprint, 4, seed, 10)
        assert torch.equal(loaded.vectors, made.vectors)
    assert [c.name for c in again.list()] == ["alpha", "beta"]


def test_names_exist_once_unless_replaced(tmp_path):
    store = ContextStore(tmp_path, "model-a")
    put(store, context("alpha"))
    with pytest.raises(ContextExists):
        store.reserve("alpha", replace=False)
    put(store, context("alpha", seed=5), replace=True)
    assert store.get("alpha").seed == 5
    store.reserve("pending", replace=True)
    with pytest.raises(ContextExists, match="being created"):
        store.reserve("pending", replace=True)  # a create in flight holds the name even for a replace
    with pytest.raises(ContextBusy, match="being created"):
        store.delete("pending")
    store.release("pending")
    with pytest.raises(ContextNotFound):
        store.get("pending")
    with pytest.raises(ContextReserved):
        store.reserve(DEFAULT_NAME, replace=True)


def test_delete_removes_the_file(tmp_path):
    store = ContextStore(tmp_path, "model-a")
    put(store, context("alpha"))
    store.delete("alpha")
    assert not (tmp_path / "contexts" / "alpha.safetensors").exists()
    with pytest.raises(ContextNotFound):
        store.delete("alpha")


def test_contexts_of_another_model_are_refused(tmp_path, caplog):
    store = ContextStore(tmp_path, "model-a")
    put(store, context("alpha"))
    del store
    other = ContextStore(tmp_path, "model-b")
    assert "another model" in caplog.text
    with pytest.raises(ContextModelMismatch) as error:
        other.get("alpha")
    assert "model-a" in error.value.message
    with pytest.raises(ContextExists):
        other.reserve("alpha", replace=False)
    put(other, context("alpha", identity="model-b"), replace=True)
    assert other.get("alpha").model_identity == "model-b"


def test_an_interrupted_write_keeps_the_previous_file(tmp_path, monkeypatch):
    store = ContextStore(tmp_path, "model-a")
    put(store, context("alpha"))
    before = (tmp_path / "contexts" / "alpha.safetensors").read_bytes()

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        put(store, context("alpha", seed=9), replace=True)
    monkeypatch.undo()
    assert (tmp_path / "contexts" / "alpha.safetensors").read_bytes() == before
    assert store.get("alpha").seed == 0  # the context served is still the one on disk
    assert sorted(p.name for p in (tmp_path / "contexts").iterdir()) == ["alpha.safetensors"]
    store.reserve("alpha", replace=True)  # the failed create gave its name back
    store.release("alpha")


def test_start_up_removes_leftovers_and_skips_unreadable_files(tmp_path, caplog):
    store = ContextStore(tmp_path, "model-a")
    put(store, context("alpha"))
    del store
    folder = tmp_path / "contexts"
    (folder / ".tmp-beta-123-456").write_bytes(b"half a file")
    (folder / "broken.safetensors").write_bytes(b"not safetensors")
    (folder / "bad name.safetensors").write_bytes(b"")
    (folder / "notes.txt").write_text("left alone")
    again = ContextStore(tmp_path, "model-a")
    assert [c.name for c in again.list()] == ["alpha"]
    assert not (folder / ".tmp-beta-123-456").exists() and (folder / "notes.txt").exists()
    assert "broken.safetensors" in caplog.text
    with pytest.raises(ContextDamaged, match="broken"):
        again.get("broken")


def _damage(path: Path, offset_from_end: int = 3) -> None:
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x40  # one bit of one float of the vectors
    path.write_bytes(bytes(data))


def test_a_damaged_file_is_named_damaged_and_can_be_replaced_or_deleted(tmp_path):
    store = ContextStore(tmp_path, "model-a")
    put(store, context("alpha"))
    put(store, context("beta", seed=1))
    store.close()
    folder = tmp_path / "contexts"
    _damage(folder / "alpha.safetensors")
    _damage(folder / "beta.safetensors", offset_from_end=7)
    again = ContextStore(tmp_path, "model-a")
    for name in ("alpha", "beta"):
        with pytest.raises(ContextDamaged, match="checksum") as error:
            again.get(name)  # never served with other vectors, never "no context named"
        assert error.value.param == "context"
    assert [c.name for c in again.list()] == [] and set(again.damaged()) == {"alpha", "beta"}
    with pytest.raises(ContextExists):
        again.reserve("alpha", replace=False)
    put(again, context("alpha", seed=3), replace=True)
    assert again.get("alpha").seed == 3
    again.delete("beta")
    with pytest.raises(ContextNotFound):
        again.get("beta")


def test_non_finite_vectors_are_damaged_even_with_a_good_checksum(tmp_path):
    store = ContextStore(tmp_path, "model-a")
    bad = context("nan")
    bad.vectors[1, 2] = float("nan")
    put(store, bad)  # written as given; the check is at load
    store.close()
    with pytest.raises(ContextDamaged, match="NaN"):
        ContextStore(tmp_path, "model-a").get("nan")


def test_a_state_dir_that_cannot_be_written_is_named(tmp_path, monkeypatch):
    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(StateDirError, match=str(tmp_path / "ro")) as error:
        ContextStore(tmp_path / "ro", "model-a")
    assert "Permission denied" in str(error.value) and isinstance(error.value, RuntimeError)


def test_replicas_share_one_state_dir(tmp_path):
    a = ContextStore(tmp_path, "model-a", refresh_seconds=0)
    b = ContextStore(tmp_path, "model-a", refresh_seconds=0)
    put(a, context("alpha"))
    assert b.get("alpha").fingerprint == "fp-alpha-0"  # created through one replica, served by the other
    put(b, context("alpha", seed=4), replace=True)
    assert torch.equal(a.get("alpha").vectors, context("alpha", seed=4).vectors)
    a.delete("alpha")
    with pytest.raises(ContextNotFound):
        b.get("alpha")
    put(b, context("beta"))
    a.delete("beta")  # a replica deletes what another made, whether or not it has read it yet
    assert [c.name for c in b.list()] == []


def test_a_file_damaged_or_removed_while_served_is_noticed_alike_by_every_replica(tmp_path):
    """No write through a server: the generation file is unchanged. A store that kept the context in memory must
    still notice its file changed (size, mtime, inode), as a store started later does, so replicas agree."""
    a = ContextStore(tmp_path, "model-a", refresh_seconds=0)
    b = ContextStore(tmp_path, "model-a", refresh_seconds=0)
    put(a, context("alpha"))
    put(a, context("beta", seed=1))
    for store in (a, b):
        assert store.get("alpha").fingerprint == "fp-alpha-0"
    folder = tmp_path / "contexts"
    _damage(folder / "alpha.safetensors")  # in place: same inode and size, a new mtime
    (folder / "beta.safetensors").unlink()
    for store in (a, b, ContextStore(tmp_path, "model-a")):
        with pytest.raises(ContextDamaged, match="checksum"):
            store.get("alpha")
        with pytest.raises(ContextNotFound):
            store.get("beta")
    shutil.copy(folder / "alpha.safetensors", tmp_path / "damaged")
    put(b, context("alpha", seed=2), replace=True)  # repaired through one replica: served by all
    assert a.get("alpha").seed == 2
    os.replace(tmp_path / "damaged", folder / "alpha.safetensors")  # a new inode, by hand again
    with pytest.raises(ContextDamaged):
        a.get("alpha")


def test_two_creates_of_one_name_through_two_replicas_give_one_success(tmp_path):
    a = ContextStore(tmp_path, "model-a", refresh_seconds=0)
    b = ContextStore(tmp_path, "model-a", refresh_seconds=0)
    a.reserve("gamma", replace=False)
    b.reserve("gamma", replace=False)  # neither knows of the other's create yet
    a.commit(context("gamma"))
    with pytest.raises(ContextExists, match="another replica"):
        b.commit(context("gamma", seed=2))
    assert b.get("gamma").seed == 0 and a.get("gamma").seed == 0
    b.reserve("gamma", replace=True)  # the failed create gave its name back
    b.release("gamma")


def test_a_delete_holds_no_lock_a_lookup_waits_for_across_fsync(tmp_path, monkeypatch):
    store = ContextStore(tmp_path, "model-a")
    put(store, context("alpha"))
    put(store, context("beta"))
    lookups = []

    def slow_fsync(folder):
        reader = threading.Thread(target=lambda: lookups.append(store.get("beta").name))
        reader.start()
        reader.join(timeout=5)  # a lookup (the event loop's) runs while the delete is in its fsync
        assert not reader.is_alive()

    monkeypatch.setattr(contexts, "fsync_dir", slow_fsync)
    store.delete("alpha")
    assert lookups == ["beta"]


def test_without_a_state_dir_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = ContextStore(None, "model-a")
    put(store, context("alpha"))
    assert store.get("alpha").name == "alpha" and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- real server processes
def _embed(server, name: str, texts: list[str]) -> np.ndarray:
    with server.client() as client:
        response = client.post(
            "/v1/embeddings",
            json={"model": "tiny-cde", "input": texts, "context": name, "encoding_format": "base64", "truncate": True},
        )
    assert response.status_code == 200, response.text
    return np.stack([np.frombuffer(base64.b64decode(r["embedding"]), dtype="<f4") for r in response.json()["data"]])


def _fingerprints(server) -> dict[str, str]:
    with server.client() as client:
        return {c["name"]: c["fingerprint"] for c in client.get("/v1/contexts").json()["data"]}


def _flags(tmp_path: Path) -> list[str]:
    # Forwards kept full: the cut of a batch into forwards follows a cost each server measures at start, and another
    # cut pads the texts differently, which moves the last bit of an embedding (seen under load: 1 ulp apart).
    return ["--state-dir", str(tmp_path / "state"), "--served-model-name", "tiny-cde", "--api-key-env",
            "CDE_ST_TEST_API_KEY", "--forward-overhead-tokens", "off"]  # fmt: skip


@pytest.fixture(scope="module")
def stored(cde_dir, tmp_path_factory) -> dict:
    """One server's state directory after it created three contexts and was stopped by SIGTERM, with what it
    answered before the stop; each test works on a copy of that directory."""
    folder = tmp_path_factory.mktemp("stored")
    first = Server(cde_dir, folder / "server.log", *_flags(folder))
    try:
        with first.client() as client:
            made = {}
            for name, docs, seed in [("short", SHORT_DOCS, 1), ("topics", TOPIC_DOCS, 2), ("kept", SHORT_DOCS, 0)]:
                made[name] = client.post(
                    "/v1/contexts", json={"name": name, "documents": docs, "size": 8, "seed": seed}
                )
        before = {name: _embed(first, name, SHORT_DOCS) for name in ("short", "topics", "default")}
        fingerprints = _fingerprints(first)
    finally:
        code = first.stop()
    return {"state": folder / "state", "made": made, "before": before, "fingerprints": fingerprints, "code": code}


def _copy_state(stored: dict, tmp_path: Path) -> None:
    shutil.copytree(stored["state"], tmp_path / "state")


def test_restart_keeps_fingerprints_and_bit_identical_embeddings(cde_dir, start_server, stored, tmp_path):
    for name in ("short", "topics"):
        assert stored["made"][name].status_code == 201, stored["made"][name].text
    # SIGTERM: uvicorn shuts down gracefully, then exits by the signal it caught (or 0)
    assert stored["code"] in (0, -signal.SIGTERM)
    _copy_state(stored, tmp_path)
    second = start_server(cde_dir, *_flags(tmp_path))
    assert _fingerprints(second) == stored["fingerprints"]
    for name, embedded in stored["before"].items():
        assert np.array_equal(_embed(second, name, SHORT_DOCS), embedded), name


def test_sigkill_during_a_context_write_leaves_the_previous_state(cde_dir, start_server, stored, tmp_path):
    made = stored["made"]["kept"]
    assert made.status_code == 201
    _copy_state(stored, tmp_path)
    # The test hook holds every write between the fsynced temporary file and its rename.
    paused = start_server(cde_dir, *_flags(tmp_path), env={PAUSE_ENV: "60"})
    baseline = _embed(paused, "kept", TOPIC_DOCS)
    folder = tmp_path / "state" / "contexts"

    def replace():
        with paused.client(key=API_KEY, timeout=90) as client:
            try:
                client.post("/v1/contexts", json={"name": "kept", "documents": TOPIC_DOCS, "replace": True})
            except Exception:  # the server dies under the request: no answer is expected
                pass

    writer = threading.Thread(target=replace, daemon=True)
    writer.start()
    deadline = time.monotonic() + 60
    while not any(p.name.startswith(".tmp-") for p in folder.iterdir()):
        assert time.monotonic() < deadline, "the context write never started"
        time.sleep(0.05)
    paused.stop(signal.SIGKILL)
    writer.join(timeout=30)
    assert any(p.name.startswith(".tmp-") for p in folder.iterdir())  # killed inside the write, as intended
    third = start_server(cde_dir, *_flags(tmp_path))
    assert _fingerprints(third)["kept"] == made.json()["fingerprint"]
    assert np.array_equal(_embed(third, "kept", TOPIC_DOCS), baseline)
    # the leftover was cleaned up (the other contexts of the copied directory stay)
    assert sorted(p.name for p in folder.iterdir()) == ["kept.safetensors", "short.safetensors", "topics.safetensors"]
