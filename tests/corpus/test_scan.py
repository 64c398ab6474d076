"""The first pass over a corpus: records counted by position, repeated ids named by both places or left out with
their positions, the sample offered only the records that will be embedded, and the ids table removed."""

from __future__ import annotations

import pytest
from corpus_helpers import DOCS, write_jsonl

from cde_st.corpus import BottomKSample, CorpusReader
from cde_st.corpus import scan as scan_module
from cde_st.corpus.scan import IDS_TABLE, scan_corpus
from cde_st.data import DataError, document_text

#: Positions 0-2 valid, 3 not JSON, 4 repeats d1, 5-6 valid, 7 repeats d5 (in a later batch of 2).
ROWS = [*DOCS[:3], "not json", {**DOCS[9], "_id": "d1"}, *DOCS[5:7], {**DOCS[8], "_id": "d5"}]


def test_the_scan_counts_positions_and_leaves_repeats_out_of_the_sample(tmp_path, monkeypatch):
    monkeypatch.setattr(scan_module, "SCAN_BATCH", 2)  # repeats within a batch and across batches
    reader = CorpusReader(write_jsonl(tmp_path / "c.jsonl", ROWS), skip_invalid=True)
    seen = []
    result = scan_corpus(
        reader,
        tmp_path,
        sample=BottomKSample(100, seed=0),
        show_progress_bar=False,
        on_batch=lambda batch, repeated: seen.append((list(batch.ids), sorted(repeated))),
    )
    assert (result.records, result.valid) == (8, 5)
    assert result.skipped == {"duplicate id": 2, "invalid JSON": 1}
    assert result.duplicate_positions == [4, 7]
    kept = [document_text(d["title"], d["text"]) for d in [*DOCS[:3], *DOCS[5:7]]]
    assert sorted(result.sample) == sorted(kept)  # the repeats' texts are not sampled
    assert seen == [(["d0", "d1"], []), (["d2", "d1"], [1]), (["d5", "d6"], []), (["d5"], [0])]
    assert not (tmp_path / IDS_TABLE).exists()
    assert result.to_dict() == {
        "records": 8,
        "valid": 5,
        "skipped": {"duplicate id": 2, "invalid JSON": 1},
        "duplicate_positions": [4, 7],
    }


def test_a_repeated_id_is_named_by_both_lines_without_skip_invalid(tmp_path):
    reader = CorpusReader(write_jsonl(tmp_path / "c.jsonl", [*DOCS[:3], {**DOCS[5], "_id": "d1"}]))
    with pytest.raises(DataError, match=r"c\.jsonl:4: duplicate id 'd1' \(first at .*c\.jsonl:2\)"):
        scan_corpus(reader, tmp_path, show_progress_bar=False)
    assert not (tmp_path / IDS_TABLE).exists()  # removed on the error too


def test_without_a_sample_none_is_kept(tmp_path):
    reader = CorpusReader(write_jsonl(tmp_path / "c.jsonl", DOCS[:4]))
    result = scan_corpus(reader, tmp_path, show_progress_bar=False)
    assert (result.records, result.valid, result.skipped, result.sample) == (4, 4, {}, None)
