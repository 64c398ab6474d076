"""Task prefixes by mteb task type and role."""

from __future__ import annotations

import pytest

from cde_st.evaluation.prefixes import TaskPrefixes


def test_task_prefixes_by_type_and_overrides():
    p = TaskPrefixes()
    assert p.for_inputs("Retrieval", "query") == "search_query: "
    assert p.for_inputs("Reranking", "document") == "search_document: "
    assert p.for_context("Retrieval") == "search_document: "
    assert p.for_inputs("Classification", None) == p.for_context("Classification") == "classification: "
    assert p.for_inputs("Clustering", None) == "clustering: "
    assert p.for_inputs("STS", None) == "classification: "
    custom = p.with_overrides({"symmetric": "sts: ", "query": "q: "})
    assert custom.for_inputs("PairClassification", None) == "sts: " and custom.for_inputs("Retrieval", "query") == "q: "
    assert TaskPrefixes.off().for_inputs("Retrieval", "query") == ""
    with pytest.raises(ValueError, match="Unknown prefix role"):
        p.with_overrides({"passage": "x"})
