"""A resume continues only the job that wrote the folder: the same corpus content, the same reader fields, an intact
context file (a missing one sampled again), a context of at least one document, the same order of a sampled
context."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from corpus_helpers import DOCS, all_rows, as_if_killed, write_jsonl

from cde_st.context_errors import ContextDamaged
from cde_st.context_files import StoredContext, read, write
from cde_st.corpus import ForeignOutputError, embed_corpus, job
from cde_st.corpus.update import recontextualize_corpus
from cde_st.fingerprints import model_fingerprint


def test_a_corpus_edited_in_place_with_the_same_size_is_refused_on_resume(tiny_plain, corpus_file, tmp_path):
    out = tmp_path / "out"
    first = embed_corpus(tiny_plain, corpus_file, out, shard_size=25, show_progress_bar=False)
    as_if_killed(out)
    path = Path(corpus_file)
    path.write_text(path.read_text().replace("rain", "snow"))  # same size, other texts
    with pytest.raises(
        ForeignOutputError, match=rf"The corpus {path} changed since .*out was written: same size"
    ) as err:
        embed_corpus(tiny_plain, corpus_file, out, shard_size=25, show_progress_bar=False)
    assert first["corpus"]["sha256"] in str(err.value)
    path.write_text(path.read_text().replace("snow", "rain"))  # the content again (a new mtime): resumed
    assert embed_corpus(tiny_plain, corpus_file, out, shard_size=25, show_progress_bar=False)["complete"]


def test_a_resume_with_other_reader_fields_is_refused_naming_both(tiny_plain, tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{**d, "body": d["text"].upper(), "id": i} for i, d in enumerate(DOCS)])
    out = tmp_path / "out"
    embed_corpus(tiny_plain, corpus, out, shard_size=25, show_progress_bar=False)
    as_if_killed(out)
    other = {
        "text_field": r"text field \(--text-field\) is 'text', this run's is 'body'",
        "title_field": r"title field \(--title-field\) is 'title', this run's is None",
        "id_field": r"id field \(--id-field\) is None, this run's is 'id'",
    }
    for field, message in other.items():
        value = {"text_field": "body", "title_field": None, "id_field": "id"}[field]
        with pytest.raises(ForeignOutputError, match=message):
            embed_corpus(tiny_plain, corpus, out, shard_size=25, reader_options={field: value}, show_progress_bar=False)
    # A folder written before the reader fields and the corpus hash were recorded resumes (nothing to compare).
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["reader"], manifest["corpus"]["sha256"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert (
        embed_corpus(tiny_plain, corpus, out, shard_size=25, show_progress_bar=False)["reader"]["text_field"] == "text"
    )


def test_a_damaged_served_context_is_refused_as_the_server_refuses_it(tiny_cde, corpus_file, tmp_path):
    vectors = torch.randn(4, 32, generator=torch.Generator().manual_seed(0))
    stored = StoredContext("docs", "f", 4, 0, vectors, model_identity=model_fingerprint(tiny_cde))
    path = write(tmp_path, stored)
    assert embed_corpus(tiny_cde, corpus_file, tmp_path / "ok", context=str(path), show_progress_bar=False)["complete"]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # a flipped bit in the last vector
    path.write_bytes(bytes(data))
    with pytest.raises(ContextDamaged):
        read(path, "docs")
    with pytest.raises(ValueError, match=r"Context 'docs' is damaged: .*docs\.safetensors: its checksum does not"):
        embed_corpus(tiny_cde, corpus_file, tmp_path / "out", context=str(path), show_progress_bar=False)


def test_a_context_of_zero_documents_is_refused(tiny_cde, corpus_file, tmp_path):
    with pytest.raises(ValueError, match=r"context_size \(--context-size\) must be at least 1 document, got 0"):
        embed_corpus(tiny_cde, corpus_file, tmp_path / "out", context_size=0, show_progress_bar=False)
    assert not (tmp_path / "out").exists()
    one = embed_corpus(tiny_cde, corpus_file, tmp_path / "one", context_size=1, show_progress_bar=False)
    assert one["context"]["size"] == 1


def test_a_hash_ordered_sample_of_a_model_that_reads_the_order_is_refused_and_finishes_with_its_own_context(
    tiny_released_v2, corpus_file, tmp_path, monkeypatch
):
    """A folder written for cde-small-v2 before cde-st-embed kept the corpus order (its sample in hash order, its
    request without an order) is not continued with a sample in corpus order, which mixes two contexts; its own
    context file finishes it, row for row as it began; --recontextualize samples it anew in corpus order."""
    out, options = tmp_path / "out", {"shard_size": 25, "show_progress_bar": False}
    with monkeypatch.context() as before:  # what cde-st-embed did then: hash order, whatever the model
        before.setattr(job, "reads_context_order", lambda module: False)
        first = embed_corpus(tiny_released_v2, corpus_file, out, **options)
    assert first["context"]["request"] == {"source": "sample", "size": 8, "seed": 0}
    _, rows = all_rows(out)
    as_if_killed(out)
    with pytest.raises(ForeignOutputError, match=r"seed 0 in hash order, .* pass --context \S+context\.safetensors;"):
        embed_corpus(tiny_released_v2, corpus_file, out, **options)
    finished = embed_corpus(tiny_released_v2, corpus_file, out, context=str(out / "context.safetensors"), **options)
    assert finished["complete"] and finished["context"] == first["context"]
    assert np.array_equal(all_rows(out)[1], rows)
    now = embed_corpus(tiny_released_v2, corpus_file, tmp_path / "now", **options)
    assert now["context"]["request"] == {"source": "sample", "size": 8, "seed": 0, "order": "corpus"}
    assert now["context"]["fingerprint"] != first["context"]["fingerprint"]
    assert embed_corpus(tiny_released_v2, corpus_file, tmp_path / "now", **options)["complete"]  # resumes as is
    resampled = recontextualize_corpus(tiny_released_v2, corpus_file, out, show_progress_bar=False)
    assert resampled["context"]["request"] == now["context"]["request"]
    assert resampled["context"]["fingerprint"] == now["context"]["fingerprint"]


def test_a_resume_whose_context_file_is_gone_samples_the_same_context_again(tiny_cde, corpus_file, tmp_path):
    out, options = tmp_path / "out", {"shard_size": 25, "show_progress_bar": False}
    first = embed_corpus(tiny_cde, corpus_file, out, **options)
    _, rows = all_rows(out)
    as_if_killed(out)
    (out / "context.safetensors").unlink()
    finished = embed_corpus(tiny_cde, corpus_file, out, **options)
    assert finished["complete"] and finished["context"]["fingerprint"] == first["context"]["fingerprint"]
    assert np.array_equal(all_rows(out)[1], rows) and (out / "context.safetensors").is_file()
