"""Loading a model by name (cde_st/model_loading.py): a folder loads as what it holds, a name that cannot be a model
says why, and :func:`load_options` records how to load the model again."""

from __future__ import annotations

import pytest
from sentence_transformers import SentenceTransformer

from cde_st.model import ContextualSentenceTransformer
from cde_st.model_loading import load_model, load_options


def test_a_missing_or_empty_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "missing_model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a model folder"):
        load_model(tmp_path / "empty")
    (tmp_path / "file").write_text("")
    with pytest.raises(FileNotFoundError, match="not a model folder"):
        load_model(tmp_path / "file")


def test_folders_load_as_what_they_hold_and_record_how(make_tiny_cde, tiny_bert_dir, tmp_path):
    make_tiny_cde(context_size=4).save(str(tmp_path / "cde"))
    SentenceTransformer(tiny_bert_dir).save(str(tmp_path / "plain"))
    contextual, plain = load_model(tmp_path / "cde"), load_model(str(tmp_path / "plain"))
    assert isinstance(contextual, ContextualSentenceTransformer) and contextual.context_size == 4
    assert type(plain) is SentenceTransformer
    assert load_options(contextual) == load_options(plain) == {"backend": "torch", "onnx_file": None}
