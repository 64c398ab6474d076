"""The corpus context: saved with what it came from and read back bit for bit, read from a ``.npy`` file or a
``cde-st-serve`` context (refused when another model made it), the model's own context, and clear errors for a file
that holds no usable vectors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cde_st.context import fingerprint_array, fingerprint_texts
from cde_st.corpus import CorpusContext, context_path, read_context_file
from cde_st.corpus.corpus_context import CONTEXT_FILE, embed_sampled_context, given_context

VECTORS = np.random.default_rng(0).normal(size=(4, 32)).astype(np.float32)


def _served(path, identity: str = "0123456789abcdef"):
    """A context file as ``cde-st-serve`` writes it (without the checksum files of older servers lack)."""
    from safetensors.numpy import save_file

    meta = {"name": "docs", "fingerprint": "f", "size": 4, "seed": 0, "model_identity": identity}
    save_file({"vectors": VECTORS}, str(path), {"cde_st_serving_context": json.dumps(meta)})
    return path


def test_a_saved_context_reads_back_with_what_it_came_from(tmp_path):
    request = {"source": "sample", "size": 4, "seed": 3}
    context = CorpusContext(VECTORS, "sample", request, texts_fingerprint="t", details={"note": 1})
    assert context.describe() == {
        "fingerprint": fingerprint_array(VECTORS),
        "size": 4,
        "dimension": 32,
        "source": "sample",
        "request": request,
        "texts_fingerprint": "t",
        "details": {"note": 1},
    }
    context.save(tmp_path / CONTEXT_FILE)
    read = read_context_file(tmp_path / CONTEXT_FILE)
    assert np.array_equal(read.vectors, VECTORS) and read.describe() == context.describe()
    assert [p.name for p in tmp_path.iterdir()] == [CONTEXT_FILE]  # written whole, no temporary file left
    assert context_path(tmp_path, {}) == tmp_path / CONTEXT_FILE
    assert context_path(tmp_path, {"context_file": "context.v2.safetensors"}) == tmp_path / "context.v2.safetensors"


def test_a_npy_file_is_a_file_context_named_by_its_path(tmp_path):
    np.save(tmp_path / "ctx.npy", VECTORS.astype(np.float64))
    context = read_context_file(tmp_path / "ctx.npy")
    assert context.vectors.dtype == np.float32 and np.allclose(context.vectors, VECTORS)
    path = str((tmp_path / "ctx.npy").resolve())
    assert (context.source, context.request) == ("file", {"source": "file", "path": path})


def test_a_file_without_usable_vectors_is_named(tmp_path):
    from safetensors.numpy import save_file

    with pytest.raises(FileNotFoundError, match=r"Context file .*nope\.npy does not exist"):
        read_context_file(tmp_path / "nope.npy")
    for name, array in (("flat.npy", VECTORS[0]), ("empty.npy", np.zeros((0, 32), np.float32))):
        np.save(tmp_path / name, array)
        with pytest.raises(ValueError, match=rf"{name}: context vectors must have shape \(J, d\) with J >= 1, got"):
            read_context_file(tmp_path / name)
    save_file({"embeddings": VECTORS}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match=r"other\.safetensors: no 'vectors' tensor \(found: \['embeddings'\]\)"):
        read_context_file(tmp_path / "other.safetensors")


def test_a_served_context_is_read_for_its_model_and_refused_for_another(tmp_path):
    path = _served(tmp_path / "docs.safetensors")
    context = read_context_file(path, {"0123456789abcdef", "other"})
    assert np.array_equal(context.vectors, VECTORS) and context.source == "file"
    assert context.details == {"served_name": "docs", "served_fingerprint": "f"}
    assert read_context_file(path).details["served_name"] == "docs"  # no identities given: not compared
    with pytest.raises(ValueError, match=r"context 'docs' was made by another model \(identity 0123456789abcdef; "
                                         r"this model is aaaa / bbbb\)"):  # fmt: skip
        read_context_file(path, {"bbbb", "aaaa"})


def test_the_models_own_context_and_a_sampled_one(make_tiny_cde, tiny_plain):
    model = make_tiny_cde(context_size=4)
    with pytest.raises(ValueError, match="the model has no saved context; sample one from the corpus instead"):
        given_context(model, "model")
    texts = ["rain falls", "sun shines", "wind blows", "snow melts"]
    info = model.set_context(texts)
    own = given_context(model, "model")
    assert own.source == "model" and own.request == {"source": "model"} and own.texts_fingerprint == info.fingerprint
    assert np.array_equal(own.vectors, model.contextual_module.context_vectors.numpy())
    sampled = embed_sampled_context(model, texts, "passage: ", size=4, seed=7, batch_size=2)
    assert sampled.request == {"source": "sample", "size": 4, "seed": 7}
    assert sampled.texts_fingerprint == fingerprint_texts(["passage: " + t for t in texts])
    expected = model.contextual_module.embed_context_texts(["passage: " + t for t in texts], batch_size=4)
    np.testing.assert_allclose(sampled.vectors, expected.detach().numpy(), atol=1e-5)
    with pytest.raises(TypeError, match="a context is for a contextual model only"):
        embed_sampled_context(tiny_plain, texts, "", size=4, seed=0, batch_size=2)
