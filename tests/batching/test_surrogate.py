"""Surrogate embeddings of the pairs (embed_pairs) and the static surrogate's distillation, cache and fit."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from batching_helpers import pair_dataset, topic_dataset

from cde_st.batching import ClusteredBatchSampler, distill_static_surrogate, embed_pairs, load_static_surrogate


def test_embed_pairs_normalised_and_restores_max_length(tiny_st_model):
    before = tiny_st_model.max_seq_length
    q, d = embed_pairs(tiny_st_model, ["a query", "another"], ["a doc", "a second doc"], max_seq_length=8)
    assert q.shape == d.shape == (2, 32) and q.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    assert tiny_st_model.max_seq_length == before


def test_static_surrogate_is_deterministic_and_harder_than_random(static_root, topic_bert_dir, monkeypatch):
    monkeypatch.setenv("CDE_ST_CACHE", str(static_root))
    ds, topic = topic_dataset(128, seed=1)
    kwargs = dict(
        surrogate=topic_bert_dir, surrogate_kind="static", static_fit_pairs=64, static_dims=8, cluster_size=16,
        cache=False, show_progress_bar=False,
    )  # fmt: skip
    first = ClusteredBatchSampler(ds, 16, False, **kwargs)
    second = ClusteredBatchSampler(ds, 16, False, **kwargs)
    assert list(first) == list(second)
    # The topic words dominate the (random) tiny encoder's token table: batches share topics more than random.
    same_topic = np.mean([np.mean(topic[b] == np.bincount(topic[b]).argmax()) for b in first])
    assert same_topic > 0.5  # random batches of 16 over 4 topics: about 0.4


def test_distilled_surrogate_is_cached_and_reused(static_root, topic_bert_dir, monkeypatch):
    import model2vec.distill

    from cde_st.batching.cache import embedding_cache_key

    cache_dir = static_root / "surrogates"
    folders = [p for p in cache_dir.iterdir() if p.is_dir()]
    assert len(folders) == 1 and folders[0].name.startswith(f"static-{embedding_cache_key(topic_bert_dir)[:24]}-")

    def fail(*args, **kwargs):
        raise AssertionError("distilled again")

    monkeypatch.setattr(model2vec.distill, "distill", fail)
    assert distill_static_surrogate(topic_bert_dir, cache_dir=cache_dir) == folders[0]
    surrogate = load_static_surrogate(topic_bert_dir, cache_dir=cache_dir)
    assert surrogate.encode(["a query"]).shape == (1, surrogate.dim)
    # Another source model or dimension is another folder, distilled anew.
    with pytest.raises(AssertionError, match="distilled again"):
        distill_static_surrogate(topic_bert_dir, dims=8, cache_dir=cache_dir)


def test_static_surrogate_without_model2vec_says_what_to_install(tiny_bert_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "model2vec", None)  # `import model2vec` now raises ImportError
    message = r"model2vec.*pip install 'cde_st\[fast-surrogate\]'"
    with pytest.raises(ImportError, match=message):
        ClusteredBatchSampler(
            pair_dataset(40), 8, False, surrogate=tiny_bert_dir, surrogate_kind="static", cache_dir=tmp_path,
            show_progress_bar=False,
        )  # fmt: skip
    with pytest.raises(ImportError, match=message):
        distill_static_surrogate(tiny_bert_dir, cache_dir=tmp_path)


@pytest.mark.parametrize("kind", ["transformer", "static"])
@pytest.mark.parametrize("where", ["missing", "not_a_model"])
def test_surrogate_that_is_no_model_is_named(tmp_path, monkeypatch, kind, where):
    """A surrogate folder that does not exist or holds no model: the error says it is the surrogate, names the
    folder and says what to give."""
    import re

    if kind == "static":
        pytest.importorskip("model2vec")
    monkeypatch.setenv("CDE_ST_CACHE", str(tmp_path / "cde_st_cache"))
    surrogate = tmp_path / "surrogate"
    if where == "not_a_model":
        surrogate.mkdir()
        (surrogate / "notes.txt").write_text("not a model")
    pattern = rf"surrogate.*{re.escape(str(surrogate))}.*(sentence-transformers|hub id)"
    with pytest.raises((ValueError, OSError), match=pattern) as err:
        ClusteredBatchSampler(
            pair_dataset(40), 8, False, surrogate=str(surrogate), surrogate_kind=kind, cache_dir=tmp_path / "cache",
            show_progress_bar=False,
        )  # fmt: skip
    assert "surrogate" in str(err.value)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json"])
def test_damaged_distilled_surrogate_names_its_cache_folder(static_root, topic_bert_dir, tmp_path, name):
    """A distilled surrogate in the cache whose files were damaged (an interrupted copy): model2vec's bare error
    (JSON, safetensors header, tokenizer parse) becomes one naming the cached folder and what to do."""
    import re
    import shutil

    cache_dir = tmp_path / "surrogates"
    shutil.copytree(static_root / "surrogates", cache_dir)
    folder = next(p for p in cache_dir.iterdir() if p.is_dir())
    path = folder / name
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    pattern = rf"{re.escape(str(folder))}.*{re.escape(topic_bert_dir)}.*[Dd]elete"
    with pytest.raises(ValueError, match=pattern) as err:
        load_static_surrogate(topic_bert_dir, cache_dir=cache_dir)
    assert name in str(err.value)
