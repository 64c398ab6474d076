"""Loading and input validation of ContextualTransformer / ContextualSentenceTransformer: every broken file, setting
or input gives an error that names the problem (the file, the setting, the value) instead of a silent wrong result."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from sentence_transformers import SentenceTransformer

from cde_st import ContextualSentenceTransformer
from cde_st.modules import ContextualTransformer
from cde_st.modules.context_state import CONTEXT_FILE

DOCS = [
    "The cat sat on the mat.",
    "Rain forms when water vapour condenses into droplets.",
    "Stocks fell sharply on Monday after the announcement.",
    "Glaciers are retreating in most mountain ranges of the world.",
    "Coffee contains caffeine.",
]


@pytest.fixture
def saved_cde(make_tiny_cde, tmp_path) -> str:
    """A tiny model (J = 4, hidden 32) saved with an active context."""
    model = make_tiny_cde(context_size=4)
    model.set_context(DOCS, seed=0)
    path = str(tmp_path / "cde")
    model.save(path)
    return path


def _edit_config(path: str, **changes) -> None:
    config_path = os.path.join(path, "cde_config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    for key, value in changes.items():
        if value is _DELETE:
            del config[key]
        else:
            config[key] = value
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f)


_DELETE = object()


# ---------------------------------------------------------------- 1. the saved context file
def test_missing_context_file_is_an_error(saved_cde):
    os.remove(os.path.join(saved_cde, CONTEXT_FILE))
    with pytest.raises(FileNotFoundError, match=r"context\.safetensors.*context_info"):
        ContextualSentenceTransformer(saved_cde)
    with pytest.raises(FileNotFoundError, match=r"context\.safetensors.*context_info"):
        SentenceTransformer(saved_cde, trust_remote_code=True)


def test_stray_context_file_without_context_info_warns(saved_cde):
    _edit_config(saved_cde, context_info=None)
    with pytest.warns(UserWarning, match=r"context\.safetensors.*ignor"):
        model = ContextualSentenceTransformer(saved_cde)
    assert model.context_info is None


@pytest.mark.parametrize(
    ("vectors", "match"),
    [
        (torch.randn(5, 32), r"5 context vectors.*context_size=4"),
        (torch.full((4, 32), float("nan")), "NaN"),
        (torch.full((4, 32), float("inf")), "infinite"),
        (torch.randn(4, 16), r"shape \(n, 32\)"),
        (torch.randn(32), r"shape \(n, 32\)"),
    ],
    ids=["too_many_rows", "nan", "inf", "wrong_width", "1d"],
)
def test_context_file_is_validated_on_load(saved_cde, vectors, match):
    save_file({"vectors": vectors.contiguous()}, os.path.join(saved_cde, CONTEXT_FILE))
    _edit_config(saved_cde, context_info={"size": len(vectors), "seed": 0, "fingerprint": "x", "source": "texts"})
    with pytest.raises(ValueError, match=match) as info:
        ContextualSentenceTransformer(saved_cde)
    assert CONTEXT_FILE in str(info.value)


def test_context_info_size_must_match_context_file(saved_cde):
    context_path = os.path.join(saved_cde, CONTEXT_FILE)
    save_file({"vectors": load_file(context_path)["vectors"][:3].contiguous()}, context_path)
    with pytest.raises(ValueError, match=r"context\.safetensors.*3 .*size=4|size=4.*3 "):
        ContextualSentenceTransformer(saved_cde)


def test_context_file_without_vectors_key(saved_cde):
    save_file({"other": torch.zeros(4, 32)}, os.path.join(saved_cde, CONTEXT_FILE))
    with pytest.raises(ValueError, match=r"context\.safetensors.*'vectors'"):
        ContextualSentenceTransformer(saved_cde)


def test_config_bad_context_info_is_named(saved_cde):
    _edit_config(saved_cde, context_info={"size": 4})
    with pytest.raises(ValueError, match=r"cde_config\.json.*context_info"):
        ContextualSentenceTransformer(saved_cde)


def test_load_module_directly_still_works(saved_cde):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module = ContextualTransformer.load(saved_cde)
    assert module.context_info is not None and module.context_vectors.shape == (4, 32)


# ---------------------------------------------------------------- 2. context_vectors that require grad
@pytest.mark.parametrize(
    ("vectors", "match"),
    [
        (torch.full((4, 32), float("nan")), "NaN"),
        (torch.randn(5, 32), "context_size=4"),
        (torch.randn(4, 16), r"shape \(n, 32\)"),
    ],
    ids=["nan", "too_many_rows", "wrong_width"],
)
def test_context_vectors_requiring_grad_are_validated(make_tiny_cde, vectors, match):
    module = make_tiny_cde(context_size=4).contextual_module
    features = module.preprocess(DOCS[:2])
    with pytest.raises(ValueError, match=match):
        module(dict(features), context_vectors=vectors.requires_grad_(True))


def test_context_vectors_gradient_still_flows(make_tiny_cde):
    module = make_tiny_cde(context_size=4).contextual_module
    features = module.preprocess(DOCS[:2])
    vectors = torch.randn(3, 32, requires_grad=True)
    module(dict(features), context_vectors=vectors)["sentence_embedding"].sum().backward()
    assert vectors.grad is not None and vectors.grad.abs().sum() > 0


# ---------------------------------------------------------------- 3. max_seq_length
@pytest.mark.parametrize("key", ["max_seq_length", "context_max_seq_length"])
@pytest.mark.parametrize("value", [0, -1, 2.5, True])
def test_bad_max_seq_length_rejected_at_construction(make_tiny_cde, key, value):
    with pytest.raises(ValueError, match=rf"{key} must be a positive integer.*{value!r}"):
        make_tiny_cde(context_size=4, **{key: value})


@pytest.mark.parametrize("key", ["max_seq_length", "context_max_seq_length"])
def test_max_seq_length_beyond_position_table_rejected(make_tiny_cde, key):
    with pytest.raises(ValueError, match=rf"{key}=1000.*max_position_embeddings=512"):
        make_tiny_cde(context_size=4, **{key: 1000})
    make_tiny_cde(context_size=4, **{key: 512})  # the limit itself is fine


def test_bad_max_seq_length_rejected_when_set(make_tiny_cde):
    model = make_tiny_cde(context_size=4, max_seq_length=64)
    for value in (0, -3):
        with pytest.raises(ValueError, match=rf"max_seq_length must be a positive integer.*{value}"):
            model.max_seq_length = value
    with pytest.raises(ValueError, match=r"max_seq_length=513.*max_position_embeddings=512"):
        model.max_seq_length = 513
    with pytest.raises(ValueError, match="context_max_seq_length must be a positive integer"):
        model.contextual_module.context_max_seq_length = 0
    assert model.max_seq_length == 64
    model.max_seq_length = 128
    assert model.contextual_module.max_seq_length == 128
    assert model.encode_document(DOCS[:2]).shape == (2, 32)


def test_max_seq_length_in_saved_config_is_validated(saved_cde):
    _edit_config(saved_cde, max_seq_length=0)
    with pytest.raises(ValueError, match=r"cde_config\.json.*max_seq_length must be a positive integer"):
        ContextualSentenceTransformer(saved_cde)


# ---------------------------------------------------------------- 4. backend and model_kwargs
def test_backends_other_than_torch_and_an_onnx_export_are_refused(saved_cde):
    with pytest.raises(ValueError, match=r"backend='openvino'.*not supported.*backend='torch'"):
        ContextualSentenceTransformer(saved_cde, backend="openvino")
    with pytest.raises(ValueError, match=r"backend='openvino'.*not supported.*backend='torch'"):
        SentenceTransformer(saved_cde, trust_remote_code=True, backend="openvino")
    # onnx: a folder exported by cde-st-convert --to onnx (tests/export); a plain saved folder has no graphs.
    with pytest.raises(FileNotFoundError, match="has no ONNX export"):
        ContextualSentenceTransformer(saved_cde, backend="onnx")


@pytest.mark.parametrize(
    "model_kwargs",
    [{"dtype": torch.bfloat16}, {"torch_dtype": "bfloat16"}, {"dtype": "bfloat16"}],
    ids=["dtype", "torch_dtype_str", "dtype_str"],
)
def test_model_kwargs_dtype_is_honoured(saved_cde, model_kwargs):
    reference = ContextualSentenceTransformer(saved_cde)
    model = ContextualSentenceTransformer(saved_cde, model_kwargs=model_kwargs)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.contextual_module.context_vectors.dtype == torch.float32  # the saved context is kept exact
    got = model.encode_document(DOCS, convert_to_tensor=True).float()
    expected = reference.encode_document(DOCS, convert_to_tensor=True)
    torch.testing.assert_close(got, expected, atol=0.1, rtol=0.1)


def test_model_kwargs_auto_dtype_uses_saved_dtype(saved_cde):
    model = ContextualSentenceTransformer(saved_cde, model_kwargs={"dtype": "auto"})
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_model_kwargs_attn_implementation_is_honoured(saved_cde):
    model = ContextualSentenceTransformer(saved_cde, model_kwargs={"attn_implementation": "eager"})
    module = model.contextual_module
    assert module.first_stage.config._attn_implementation == "eager"
    assert module.second_stage.config._attn_implementation == "eager"
    reference = ContextualSentenceTransformer(saved_cde)
    assert reference.contextual_module.second_stage.config._attn_implementation == "sdpa"
    torch.testing.assert_close(
        model.encode_query(DOCS, convert_to_tensor=True),
        reference.encode_query(DOCS, convert_to_tensor=True),
        atol=1e-5,
        rtol=1e-5,
    )


def test_unsupported_model_kwargs_warn(saved_cde):
    with pytest.warns(UserWarning, match=r"ignores.*'low_cpu_mem_usage'"):
        ContextualSentenceTransformer(saved_cde, model_kwargs={"low_cpu_mem_usage": True})


def test_bad_dtype_named(saved_cde):
    with pytest.raises(ValueError, match=r"dtype.*'float99'"):
        ContextualSentenceTransformer(saved_cde, model_kwargs={"dtype": "float99"})


# ---------------------------------------------------------------- 5. loading errors
@pytest.mark.parametrize("name", ["./no/such/dir", "no_such_dir", "no/such/dir/deeper", "~/no_such_cde_dir"])
def test_missing_folder_is_named(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=rf"{name}.*does not exist"):
        ContextualSentenceTransformer(name)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"context_size": 4, "max_seq', r"not valid JSON"),
        ("[1, 2]", r"JSON object"),
    ],
    ids=["truncated", "not_an_object"],
)
def test_invalid_config_file_is_named(saved_cde, text, match):
    with open(os.path.join(saved_cde, "cde_config.json"), "w", encoding="utf-8") as f:
        f.write(text)
    with pytest.raises(ValueError, match=match) as info:
        ContextualSentenceTransformer(saved_cde)
    assert "cde_config.json" in str(info.value)


def test_config_missing_key_is_named(saved_cde):
    _edit_config(saved_cde, second_stage_config=_DELETE)
    with pytest.raises(ValueError, match=r"cde_config\.json.*'second_stage_config'"):
        ContextualSentenceTransformer(saved_cde)


def test_config_unknown_key_is_named(saved_cde):
    _edit_config(saved_cde, context_sise=4)
    with pytest.raises(ValueError, match=r"cde_config\.json.*'context_sise'"):
        ContextualSentenceTransformer(saved_cde)


@pytest.mark.parametrize("filename", ["model.safetensors", CONTEXT_FILE])
def test_truncated_weights_file_is_named(saved_cde, filename):
    path = os.path.join(saved_cde, filename)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"{filename}.*(corrupt|truncated)"):
        ContextualSentenceTransformer(saved_cde)


# ---------------------------------------------------------------- the context of one forward: every accepted name
def _with_other_context(make_tiny_cde):
    """A model with an active context, its features, and other context vectors that change the output."""
    model = make_tiny_cde(context_size=4)
    model.set_context(DOCS, seed=0)
    module = model.contextual_module
    features = module.preprocess(DOCS[:2])
    vectors = torch.randn(4, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        given = module(dict(features), context_vectors=vectors)["sentence_embedding"]
        active = module(dict(features))["sentence_embedding"]
    assert (given - active).abs().max() > 1e-3  # the two contexts give different embeddings
    return model, module, features, vectors, given


@pytest.mark.parametrize("where", ["keyword", "feature"])
def test_forward_honours_dataset_embeddings(make_tiny_cde, where):
    """``dataset_embeddings`` (the released models' name for the context vectors) is the context of the call, as
    ``context_vectors`` is, never ignored in favour of the active context."""
    _, module, features, vectors, given = _with_other_context(make_tiny_cde)
    with torch.no_grad():
        if where == "keyword":
            got = module(dict(features), dataset_embeddings=vectors)["sentence_embedding"]
        else:
            got = module({**features, "dataset_embeddings": vectors})["sentence_embedding"]
    torch.testing.assert_close(got, given, rtol=0, atol=0)


def test_model_forward_passes_dataset_embeddings_to_the_module(make_tiny_cde):
    model, module, features, vectors, given = _with_other_context(make_tiny_cde)
    with torch.no_grad():
        got = model(dict(features), dataset_embeddings=vectors)["sentence_embedding"]
        expected = model(dict(features), context_vectors=vectors)["sentence_embedding"]
        active = model(dict(features))["sentence_embedding"]
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert (got - active).abs().max() > 1e-3


def test_forward_refuses_both_context_names(make_tiny_cde):
    _, module, features, vectors, _ = _with_other_context(make_tiny_cde)
    with pytest.raises(TypeError, match="both context_vectors= and dataset_embeddings="):
        module(dict(features), context_vectors=vectors, dataset_embeddings=vectors)


@pytest.mark.parametrize("name", ["context_vector", "datasetembeddings", "contxt_mask"])
def test_forward_refuses_an_unknown_keyword_by_name(make_tiny_cde, name):
    _, module, features, vectors, _ = _with_other_context(make_tiny_cde)
    with pytest.raises(TypeError, match=name):
        module(dict(features), **{name: vectors})


def test_encode_honours_dataset_embeddings_and_refuses_unknown_keywords(make_tiny_cde):
    model, _, _, vectors, _ = _with_other_context(make_tiny_cde)
    given = model.encode(DOCS[:2], context_vectors=vectors)
    np.testing.assert_array_equal(model.encode(DOCS[:2], dataset_embeddings=vectors), given)
    with pytest.raises((TypeError, ValueError), match="context_vector"):
        model.encode(DOCS[:2], context_vector=vectors)


def test_model_forward_refuses_an_unknown_keyword_by_name(make_tiny_cde):
    """sentence-transformers' forward hands each module only the keywords it lists, so a misspelt one reached no
    module and the call used the active context."""
    model, _, features, vectors, _ = _with_other_context(make_tiny_cde)
    with pytest.raises(TypeError, match="contxt_vectors"):
        model(dict(features), contxt_vectors=vectors)


def test_a_weighted_pool_and_sink_model_saves_and_loads_the_same(make_tiny_cde, tmp_path):
    model = make_tiny_cde(
        context_size=4, context_attention="cached", context_gate=True, context_sink=True, pooling="weighted"
    )
    module = model.contextual_module
    with torch.no_grad():  # trained-looking values, so that a lost weight would show
        module.pool.score.weight.normal_()
        module.gates.fill_(0.5)
    model.set_context(DOCS, seed=0)
    before = model.encode_query(DOCS[:3], convert_to_tensor=True)
    path = str(tmp_path / "weighted")
    model.save(path)
    loaded = ContextualSentenceTransformer(path)
    assert loaded.contextual_module.config.pooling == "weighted" and loaded.contextual_module.config.context_sink
    torch.testing.assert_close(loaded.encode_query(DOCS[:3], convert_to_tensor=True), before, rtol=0, atol=1e-6)
