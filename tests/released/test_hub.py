"""Recognising a released CDE checkpoint and finding its files (cde_st.released.hub): short names and folders,
and offline errors that name what is missing."""

from __future__ import annotations

import shutil

import pytest

from cde_st import ContextualSentenceTransformer
from cde_st.released import ReleasedCheckpointError, is_released_checkpoint


def test_short_names_and_detection(fixture_dir, tmp_path):
    assert is_released_checkpoint("cde-small") and is_released_checkpoint("cde-small-v1")
    assert is_released_checkpoint(str(fixture_dir / "v1"))
    assert not is_released_checkpoint(str(tmp_path))


def test_offline_errors_name_what_is_missing(fixture_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ReleasedCheckpointError, match=r"config\.json.*jxm/cde-small-v2"):
        ContextualSentenceTransformer("cde-small", cache_folder=str(tmp_path / "empty_cache"))
    # a copy of the released files only: the backbone config must come from the hub, which is unreachable
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(fixture_dir / "v2" / name, bare / name)
    with pytest.raises(ReleasedCheckpointError, match="backbone_config.json"):
        ContextualSentenceTransformer(str(bare), cache_folder=str(tmp_path / "empty_cache"))
    # given explicitly, backbone config and tokenizer take precedence over the hub
    model = ContextualSentenceTransformer(
        str(bare), backbone_config=str(fixture_dir / "v2" / "backbone_config.json"), tokenizer=str(fixture_dir / "v2")
    )
    assert model.context_size == 8
    (bare / "model.safetensors").unlink()
    with pytest.raises(ReleasedCheckpointError, match="model.safetensors"):
        ContextualSentenceTransformer(
            str(bare),
            backbone_config=str(fixture_dir / "v2" / "backbone_config.json"),
            tokenizer=str(fixture_dir / "v2"),
        )


def test_an_unknown_hub_id_offline_is_a_clear_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        OSError, match=r"'someone/not-a-cde-model' is not a local folder and not in the .*cache.*offline"
    ):
        ContextualSentenceTransformer("someone/not-a-cde-model", cache_folder=str(tmp_path / "empty_cache"))
