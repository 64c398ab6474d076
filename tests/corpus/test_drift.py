"""The drift measure (a reference sample made with the context, per-shard counts), --recontextualize, and the IVF
quantiser an update keeps or trains again."""

from __future__ import annotations

import numpy as np
import pytest
from corpus_helpers import DOCS, all_rows, write_jsonl

import cde_st.corpus.update as update_module
from cde_st.corpus import embed_corpus, read_manifest, read_shard
from cde_st.corpus.drift import RESAMPLE_ADVISED, DriftReference, corpus_drift
from cde_st.corpus.index import build_index, search_index
from cde_st.corpus.update import recontextualize_corpus, update_corpus

# Documents of the corpus's own kind (its template) and of another kind.
SAME = [
    {
        "_id": f"s{i}",
        "title": f"topic {i % 5}",
        "text": f"document {i + 100} says {'rain clouds' if i % 2 else 'sun'} {i % 7}",
    }
    for i in range(60)
]
OTHER = [{"_id": f"o{i}", "text": f"volcano lava eruption magma {i} basalt crater ash plume"} for i in range(60)]


def test_the_threshold_leaves_five_percent_of_documents_like_the_reference_below_it():
    rng = np.random.default_rng(0)
    centre, elsewhere = rng.normal(size=16), rng.normal(size=16)
    like = centre + 0.3 * rng.normal(size=(4000, 16))
    reference = DriftReference.from_embeddings(like[:2000])  # 1,000 reference rows, 1,000 to calibrate with
    assert len(reference.vectors) == 1000 and reference.calibration_size == 1000
    share_like = reference.count_below(like[2000:]) / 2000
    assert 0.03 < share_like < 0.08
    unlike = elsewhere + 0.3 * rng.normal(size=(500, 16))
    assert reference.count_below(unlike) == 500
    assert reference.count_below(np.zeros((0, 16))) == 0


def _embedded(model, tmp_path, name="out"):
    out = tmp_path / name
    embed_corpus(model, write_jsonl(tmp_path / "v1.jsonl", DOCS), out, shard_size=25, show_progress_bar=False)
    return out


def test_drift_stays_near_zero_with_documents_of_the_corpus_kind_and_grows_with_another_kind(tiny_cde, tmp_path):
    out = _embedded(tiny_cde, tmp_path)
    made = read_manifest(out)
    assert corpus_drift(out).percent == 0.0 and made["history"][0]["drift_percent"] == 0.0
    assert made["drift"]["reference_rows"] == 30 and made["drift"]["calibration_rows"] == 30  # 60 distinct texts
    drifts = {}
    for kind, extra in (("same", SAME), ("other", OTHER)):
        for n in (15, 30, 60):
            corpus = write_jsonl(tmp_path / f"{kind}{n}.jsonl", DOCS + extra[:n])
            manifest = update_corpus(tiny_cde, corpus, out, index="none", show_progress_bar=False)
            drifts[kind, n] = corpus_drift(out).percent
            assert manifest["history"][-1]["drift_percent"] == round(drifts[kind, n], 3)
    assert all(abs(drifts["same", n]) < 5 for n in (15, 30, 60)), drifts  # measured: 2.0, 1.1, 2.5
    assert drifts["other", 15] < drifts["other", 30] < drifts["other", 60], drifts
    assert drifts["other", 30] > RESAMPLE_ADVISED and corpus_drift(out).advised
    # The hook a benchmark calls: any embeddings, scored against the folder's reference.
    ids, stored = all_rows(out)
    scored = corpus_drift(out, embeddings=stored)
    assert scored.rows == len(ids) and scored.below == corpus_drift(out).below


def test_a_plain_model_has_no_drift(tiny_plain, tmp_path):
    out = _embedded(tiny_plain, tmp_path)
    assert corpus_drift(out) is None and read_manifest(out).get("drift") is None
    with pytest.raises(
        ValueError, match="embedded by a plain model \\(no context\\): there is no context to re-sample"
    ):
        recontextualize_corpus(tiny_plain, tmp_path / "v1.jsonl", out, show_progress_bar=False)


def test_recontextualize_is_a_full_run_with_the_new_sample_and_resets_the_drift(tiny_cde, tmp_path):
    out = _embedded(tiny_cde, tmp_path)
    build_index(out, show_progress_bar=False)
    corpus = write_jsonl(tmp_path / "v2.jsonl", DOCS[5:] + OTHER[:30])
    update_corpus(tiny_cde, corpus, out, show_progress_bar=False)
    assert corpus_drift(out).advised
    manifest = recontextualize_corpus(tiny_cde, corpus, out, context_size=6, seed=2, show_progress_bar=False)
    full = embed_corpus(tiny_cde, corpus, tmp_path / "full", context_size=6, seed=2, shard_size=25,
                        show_progress_bar=False)  # fmt: skip
    assert manifest["context"]["fingerprint"] == full["context"]["fingerprint"]
    assert manifest["context_file"] == "context.v2.safetensors" and manifest["generation"] == 2
    ids, rows = all_rows(out)
    full_ids, full_rows = all_rows(tmp_path / "full")
    assert ids == full_ids
    np.testing.assert_allclose(rows, full_rows, rtol=0, atol=1e-6)
    assert corpus_drift(out).percent == 0.0 and manifest["history"][-1]["kind"] == "recontextualize"
    assert manifest["index"]["quantiser"] in ("none", "trained")
    assert sorted(p.name for p in out.glob("context*")) == ["context.v2.safetensors"]  # the old context is gone
    assert search_index(out, tiny_cde, ["volcano"], k=1)[0][0][0] in ids


def test_a_recontextualize_that_fails_half_way_leaves_the_old_version_and_resumes(tiny_cde, tmp_path, monkeypatch):
    out = _embedded(tiny_cde, tmp_path)
    build_index(out, show_progress_bar=False)
    old = read_manifest(out)
    old_ids, old_rows = all_rows(out)
    corpus = write_jsonl(tmp_path / "v1.jsonl", DOCS)
    written = []
    real = update_module.record_shard

    def fail_after_one(*args, **kwargs):
        if written:
            raise KeyboardInterrupt  # stands for the process being stopped after its first new shard
        written.append(real(*args, **kwargs))
        return written[-1]

    monkeypatch.setattr(update_module, "record_shard", fail_after_one)
    with pytest.raises(KeyboardInterrupt):
        recontextualize_corpus(tiny_cde, corpus, out, seed=5, show_progress_bar=False)
    assert read_manifest(out) == old and (out / "context.v1.safetensors").is_file()
    ids, rows = all_rows(out)
    assert ids == old_ids and np.array_equal(rows, old_rows)
    assert search_index(out, tiny_cde, ["rain"], k=3)  # the old version, with its own context
    first = out / written[0]["file"]
    stamp = first.stat().st_mtime_ns
    monkeypatch.setattr(update_module, "record_shard", real)
    manifest = recontextualize_corpus(tiny_cde, corpus, out, seed=5, show_progress_bar=False)
    assert first.stat().st_mtime_ns == stamp  # kept, not written again
    assert {key: value for key, value in manifest["shards"][0].items() if key != "below"} == written[0]
    full = embed_corpus(tiny_cde, corpus, tmp_path / "full", seed=5, shard_size=25, show_progress_bar=False)
    assert manifest["context"]["fingerprint"] == full["context"]["fingerprint"]
    np.testing.assert_allclose(all_rows(out)[1], all_rows(tmp_path / "full")[1], rtol=0, atol=1e-6)


def _centroids(path):
    import faiss

    whole = faiss.read_index(str(path))  # kept referenced: the IVF view does not own it
    index = faiss.extract_index_ivf(whole)
    return index.quantizer.reconstruct_n(0, index.nlist)


def test_an_ivf_index_keeps_its_quantiser_while_the_corpus_stays_close_and_is_trained_again_after(tiny_cde, tmp_path):
    out = _embedded(tiny_cde, tmp_path)
    build_index(out, kind="ivf", show_progress_bar=False)
    trained = _centroids(out / "index.faiss")
    close = update_corpus(tiny_cde, write_jsonl(tmp_path / "v2.jsonl", DOCS + SAME[:6]), out, show_progress_bar=False)
    assert close["index"]["kind"] == "ivf" and close["index"]["quantiser"] == "kept"
    assert np.array_equal(_centroids(out / close["index"]["file"]), trained)
    ids, _ = all_rows(out)
    assert [h[0] for h in search_index(out, tiny_cde, ["rain"], k=len(ids))[0]] and close["index"]["rows"] == 66
    moved = update_corpus(tiny_cde, write_jsonl(tmp_path / "v3.jsonl", DOCS + OTHER), out, show_progress_bar=False)
    assert corpus_drift(out).advised and moved["index"]["quantiser"] == "trained"
    _, first = read_shard(out / moved["shards"][0]["file"])
    assert first.shape == (25, 32)
