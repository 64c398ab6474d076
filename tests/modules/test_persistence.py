"""Saving a ContextualTransformer to a folder and loading it back (cde_st.modules.persistence), called directly: what
a save writes and records, a round trip that gives the same module, and the errors and warning the loading side
owns (an unreadable tokenizer, a bad config field, a plain model loading a cde_st folder)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from cde_st import ContextualTransformer
from cde_st.modules.integrity import MANIFEST_FILE
from cde_st.modules.persistence import (
    config_dict,
    load_module,
    load_tokenizer,
    save_module,
    warn_if_plain_model,
)

CORPUS = ["Rain forms when vapour condenses.", "Mars is red.", "Green tea is unoxidised.", "Cats sleep a lot."]


@pytest.fixture
def module(make_tiny_cde):
    return make_tiny_cde(context_size=4)[0]


def _recorded(folder) -> list[str]:
    return sorted(json.loads((folder / MANIFEST_FILE).read_text())["files"])


def test_a_save_writes_config_weights_tokenizer_and_records_them(module, tmp_path):
    save_module(module, str(tmp_path / "plain"))
    files = _recorded(tmp_path / "plain")
    assert {"model.safetensors", "tokenizer.json"} <= set(files) and (tmp_path / "plain" / "cde_config.json").is_file()
    assert "context.safetensors" not in files and not (tmp_path / "plain" / "context.safetensors").exists()
    module.set_context(CORPUS)
    save_module(module, str(tmp_path / "with-context"))
    assert set(_recorded(tmp_path / "with-context")) == set(files) | {"context.safetensors"}
    save_module(module, str(tmp_path / "bin"), safe_serialization=False)
    assert "pytorch_model.bin" in _recorded(tmp_path / "bin") and "model.safetensors" not in _recorded(tmp_path / "bin")


def test_config_dict_holds_the_config_both_encoders_and_the_context(module):
    assert config_dict(module)["context_info"] is None
    module.set_context(CORPUS)
    saved = config_dict(module)
    assert saved["first_stage_config"]["model_type"] == saved["second_stage_config"]["model_type"] == "bert"
    assert saved["context_info"]["size"] == module.context_size == 4
    assert saved["context_attention"] == module.config.context_attention


def test_a_round_trip_gives_the_same_module(module, tmp_path):
    module.set_context(CORPUS)
    save_module(module, str(tmp_path / "saved"))
    loaded = load_module(ContextualTransformer, str(tmp_path / "saved"))
    assert loaded.config == module.config
    assert loaded.context_info == module.context_info and torch.equal(loaded.context_vectors, module.context_vectors)
    for (name, a), (_, b) in zip(module.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_an_unreadable_tokenizer_says_which_files_to_put_back(tmp_path):
    with pytest.raises(ValueError, match=r"Put the tokenizer files the model was saved with \(tokenizer.json"):
        load_tokenizer(str(tmp_path))


def test_a_bad_config_field_is_named_with_its_file(module, tmp_path):
    folder = tmp_path / "saved"
    save_module(module, str(folder))
    config = json.loads((folder / "cde_config.json").read_text())
    (folder / "cde_config.json").write_text(json.dumps({**config, "context_attention": "sideways"}))
    with pytest.raises(ValueError, match=r"cde_config\.json.*context_attention"):
        load_module(ContextualTransformer, str(folder))


def test_a_plain_model_loading_a_cde_st_folder_is_warned_once_named():
    class Plain:  # no set_context
        pass

    with pytest.warns(UserWarning, match=r"/models/mine is a cde_st model loaded into a plain Plain"):
        warn_if_plain_model("/models/mine", Plain())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_plain_model(None, Plain())  # a client wrapping the modules on purpose
        warn_if_plain_model("/models/mine", type("Contextual", (), {"set_context": None})())
