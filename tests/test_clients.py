"""The client snippets of docs/integrations.md: each examples/clients/ script runs on a tiny saved model, and the
vectors a client returns are the contextual model's own (its prompts and its corpus context)."""

from __future__ import annotations

import importlib.util
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest

CLIENTS = Path(__file__).resolve().parents[1] / "examples" / "clients"


@pytest.fixture(scope="module")
def saved_cde(tmp_path_factory, tiny_bert_dir) -> str:
    import torch

    from cde_st import ContextualSentenceTransformer

    torch.manual_seed(0)
    model = ContextualSentenceTransformer.from_encoder(
        tiny_bert_dir,
        context_size=4,
        max_seq_length=64,
        output_head="mlp",
        first_stage_residual=False,
        context_attention="joint",
    )
    folder = tmp_path_factory.mktemp("clients") / "cde"
    model.save(str(folder))
    return str(folder)


def _run(script: str, model_folder: str, monkeypatch) -> dict:
    monkeypatch.syspath_prepend(str(CLIENTS))
    monkeypatch.setattr(sys, "argv", [script, model_folder])
    return runpy.run_path(str(CLIENTS / script), run_name="__main__")


def _require(module: str, install: str) -> None:
    """Skip the test when `module` cannot be imported. find_spec on a dotted name imports its parent packages
    first and raises ModuleNotFoundError when one is missing, so a missing parent counts as not installed."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        pytest.skip(f"{module} is not installed (pip install {install}, or pip install -e '.[clients]')")


def _uninstall(module: str, monkeypatch) -> None:
    """Make ``module`` and its parent packages unimportable, as on an install without them, whether or not this
    machine has them: an import of a name whose sys.modules entry is None fails with ModuleNotFoundError. Every
    prefix is blocked because a submodule imported earlier in the session stays in sys.modules under its full name."""
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        monkeypatch.setitem(sys.modules, ".".join(parts[:i]), None)


def _normalized(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _expected(g: dict) -> tuple[np.ndarray, np.ndarray]:
    model = g["model"]
    assert model.context_info is not None and model.context_info.corpus_size == len(g["CORPUS"])
    return model.encode_document(g["CORPUS"]), model.encode_query(g["QUERIES"][:1])[0]


def test_sentence_transformers_utils(saved_cde, monkeypatch):
    g = _run("sentence_transformers_utils.py", saved_cde, monkeypatch)
    assert len(g["hits"]) == len(g["QUERIES"]) and all(len(h) == 2 for h in g["hits"])


def test_faiss(saved_cde, monkeypatch):
    _require("faiss", "faiss-cpu")
    g = _run("faiss_index.py", saved_cde, monkeypatch)
    docs, _ = _expected(g)
    assert g["index"].ntotal == len(g["CORPUS"])
    np.testing.assert_allclose(g["docs"], _normalized(docs), atol=1e-5)


def test_langchain(saved_cde, monkeypatch):
    _require("langchain_huggingface", "langchain-huggingface")
    g = _run("langchain_client.py", saved_cde, monkeypatch)
    docs, query = _expected(g)
    np.testing.assert_allclose(np.array(g["doc_vectors"]), docs, atol=1e-5)
    np.testing.assert_allclose(np.array(g["query_vector"]), query, atol=1e-5)
    # the prompts matter: without them the vectors differ
    assert not np.allclose(g["model"].encode(g["QUERIES"][:1])[0], query, atol=1e-4)


def test_llamaindex(saved_cde, monkeypatch):
    _require("llama_index.embeddings.huggingface", "llama-index-embeddings-huggingface")
    g = _run("llamaindex_client.py", saved_cde, monkeypatch)
    docs, query = _expected(g)  # LlamaIndex normalises (normalize=True)
    np.testing.assert_allclose(np.array(g["doc_vectors"]), _normalized(docs), atol=1e-5)
    np.testing.assert_allclose(np.array(g["query_vector"]), _normalized(query), atol=1e-5)


def test_mteb_direct(saved_cde, monkeypatch, tmp_path):
    _require("mteb", "mteb")
    monkeypatch.setenv("MTEB_CACHE", str(tmp_path / "mteb_cache"))
    g = _run("mteb_direct.py", saved_cde, monkeypatch)
    (result,) = g["results"].task_results
    assert result.task_name == "TinyRetrieval" and 0.0 <= result.get_score() <= 1.0
    fingerprint = g["info"].fingerprint
    assert any(fingerprint in str(p) for p in (tmp_path / "mteb_cache").rglob("TinyRetrieval.json"))


@pytest.mark.parametrize(
    "module",
    ["llama_index.embeddings.huggingface", "langchain_huggingface", "cde_st_absent_package.embeddings.huggingface"],
)
def test_require_skips_when_the_package_or_its_parent_is_absent(module, monkeypatch):
    _uninstall(module, monkeypatch)  # a fresh install without the client
    with pytest.raises(pytest.skip.Exception, match="is not installed"):
        _require(module, "the-client")


def test_require_skips_when_a_submodule_is_absent():
    with pytest.raises(pytest.skip.Exception, match="cde_st.no_such_module is not installed"):
        _require("cde_st.no_such_module", "nothing")
    with pytest.raises(pytest.skip.Exception, match="json.decoder.no_such_module is not installed"):
        _require("json.decoder.no_such_module", "nothing")  # parent is a module, not a package


def test_require_passes_when_installed():
    _require("cde_st.context", "cde_st")  # returns without skipping


@pytest.mark.parametrize(
    ("script", "module", "package"),
    [
        ("langchain_client.py", "langchain_huggingface", "langchain-huggingface"),
        ("llamaindex_client.py", "llama_index.embeddings.huggingface", "llama-index-embeddings-huggingface"),
    ],
)
def test_client_example_without_its_client_names_the_extra_to_install(script, module, package, monkeypatch):
    _uninstall(module, monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        _run(script, "unused-model-folder", monkeypatch)
    message = str(exit_.value.code)
    assert message.startswith(f"{script} needs {package}, which is not installed")
    assert 'pip install -e ".[clients]"' in message
