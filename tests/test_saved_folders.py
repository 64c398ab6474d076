"""Folders saved by earlier versions of cde_st load with identical embeddings.

``tests/fixtures/saved_a3f86a0`` holds two tiny contextual models (joint attention with an MLP head; cached context
read through gates) saved, with their corpus context, by the code of commit a3f86a0 (before the package was split by
concern), and the embeddings that code produced (``expected.json``). ``build.py`` beside them is the script that made
them; it is kept as a record, not run by the tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "saved_a3f86a0"


@pytest.mark.parametrize("name", ["joint", "cached"])
def test_folder_saved_by_a3f86a0_loads_with_identical_embeddings(name):
    from cde_st import ContextualSentenceTransformer

    expected = json.loads((FIXTURE / "expected.json").read_text())
    model = ContextualSentenceTransformer(str(FIXTURE / name))
    queries = model.encode_query(expected["queries"])
    documents = model.encode_document(expected["documents"])
    np.testing.assert_allclose(queries, np.array(expected["embeddings"][name]["query"]), rtol=0, atol=1e-6)
    np.testing.assert_allclose(documents, np.array(expected["embeddings"][name]["document"]), rtol=0, atol=1e-6)
