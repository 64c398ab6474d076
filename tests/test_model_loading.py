"""Loading a model by name (cde_st/model_loading.py): a folder loads as what its modules.json lists, a hub id as what
its modules.json (the one file fetched to decide) lists, a released model by its short name, a name that cannot be a
model says why, and :func:`load_options` records how to load the model again."""

from __future__ import annotations

import re

import pytest
from sentence_transformers import SentenceTransformer

import cde_st.model_loading as model_loading
from cde_st.model import ContextualSentenceTransformer
from cde_st.model_loading import load_model, load_options


@pytest.fixture
def hub(monkeypatch):
    """A fake hub: ``hub(repo_id, folder)`` serves ``folder`` as ``repo_id``; returns the files fetched as
    (repo_id, filename). The models' constructors read the folder in place of the hub id."""
    repos, fetched = {}, []

    def download(repo_id, filename, **kwargs):
        fetched.append((repo_id, filename))
        return str(repos[repo_id] / filename)

    def local(cls):
        return lambda name, **options: cls(str(repos.get(name, name)), **options)

    monkeypatch.setattr(model_loading, "hf_hub_download", download, raising=False)
    monkeypatch.setattr(model_loading, "ContextualSentenceTransformer", local(ContextualSentenceTransformer))
    monkeypatch.setattr(model_loading, "SentenceTransformer", local(SentenceTransformer))

    def serve(repo_id, folder):
        repos[repo_id] = folder
        return fetched

    return serve


def test_a_missing_or_empty_folder_is_named(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "missing_model")
    monkeypatch.chdir(tmp_path)
    looked_for = re.escape(f"'./missing' does not exist (looked for {tmp_path / 'missing'})")
    with pytest.raises(FileNotFoundError, match=looked_for):
        load_model("./missing")
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


def test_a_hub_id_loads_as_what_its_modules_json_lists(make_tiny_cde, tiny_bert_dir, tmp_path, hub, monkeypatch):
    make_tiny_cde(context_size=4).save(str(tmp_path / "cde"))
    SentenceTransformer(tiny_bert_dir).save(str(tmp_path / "plain"))
    fetched = hub("someone/cde-model", tmp_path / "cde")
    model = load_model("someone/cde-model")
    assert isinstance(model, ContextualSentenceTransformer) and model.context_size == 4
    assert fetched == [("someone/cde-model", "modules.json")]  # only the module list, to decide
    hub("someone/plain-model", tmp_path / "plain")
    monkeypatch.setattr(model_loading, "is_released_checkpoint", lambda name, **hub: False)  # no config.json fetch
    assert type(load_model("someone/plain-model")) is SentenceTransformer


def test_a_released_short_name_loads_contextual_without_a_hub_lookup(monkeypatch):
    built = []
    monkeypatch.setattr(model_loading, "hf_hub_download", lambda *a, **k: pytest.fail("fetched"), raising=False)
    monkeypatch.setattr(model_loading, "ContextualSentenceTransformer", lambda name, **options: built.append(name))
    load_model("cde-small")
    load_model("jxm/cde-small-v1")
    assert built == ["jxm/cde-small-v2", "jxm/cde-small-v1"]


def test_a_module_list_that_is_not_json_is_named(make_tiny_cde, tmp_path, hub):
    folder = tmp_path / "cde"
    make_tiny_cde(context_size=4).save(str(folder))
    (folder / "modules.json").write_text('[{"type": "cde_st.ContextualTransformer"')  # cut short
    with pytest.raises(ValueError, match=re.escape(f"{folder / 'modules.json'} is not valid JSON")):
        load_model(folder)
    (folder / "modules.json").write_text('{"type": "cde_st.ContextualTransformer"}')
    with pytest.raises(ValueError, match="is not a list of modules"):
        load_model(folder)
    hub("someone/damaged", folder)
    with pytest.raises(FileNotFoundError, match="'someone/damaged' .* is not a list of modules"):
        load_model("someone/damaged")


def test_a_folder_only_mentioning_cde_st_is_not_contextual(tiny_bert_dir, tmp_path):
    folder = tmp_path / "plain"
    SentenceTransformer(tiny_bert_dir).save(str(folder))
    # a module path that merely contains the name: the module types decide, not the text of the file
    listing = (folder / "modules.json").read_text()
    (folder / "modules.json").write_text(listing.replace('"1_Pooling"', '"cde_st_pooling"'))
    (folder / "1_Pooling").rename(folder / "cde_st_pooling")
    assert type(load_model(folder)) is SentenceTransformer
