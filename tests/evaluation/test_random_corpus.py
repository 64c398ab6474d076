"""cde_st.evaluation.random_corpus: the foreign documents of context="random"."""

from __future__ import annotations

import json

import pytest

from cde_st.evaluation.random_corpus import foreign_pool, load_text_corpus


def test_a_corpus_of_texts_a_txt_file_or_a_jsonl_file(tmp_path):
    texts, name = load_text_corpus(["b", "a", "b", "  "])
    assert texts == ["b", "a"] and name.startswith("texts-")  # a set of documents, named by its content
    assert load_text_corpus(["b", "a"])[1] == name
    (tmp_path / "docs.txt").write_text("one\ntwo\none\n", encoding="utf-8")
    assert load_text_corpus(tmp_path / "docs.txt") == (["one", "two"], "docs.txt")
    rows = [{"text": "body", "title": "Title"}, {"text": "other"}]
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    texts, name = load_text_corpus(str(tmp_path / "docs.jsonl"))
    assert name == "docs.jsonl" and len(texts) == 2 and "Title" in texts[0] and "body" in texts[0]


def test_a_fixed_corpus_serves_every_task_and_one_task_has_no_other(tmp_path):
    pool, name = foreign_pool([], ["x", "y"], None, max_size=8, seed=0)
    assert pool("any task") == ["x", "y"] and name.startswith("texts-")
    with pytest.raises(ValueError, match="only one task"):
        foreign_pool([object()], None, None, max_size=8, seed=0)
