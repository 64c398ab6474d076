"""The sentence-transformers loading options a contextual model honours (cde_st/modules/loading_options.py)."""

from __future__ import annotations

import pytest
import torch

from cde_st.modules.loading_options import check_backend, resolve_dtype, split_model_kwargs


def test_torch_and_onnx_are_the_backends():
    check_backend("torch")
    check_backend("onnx")
    with pytest.raises(ValueError, match="backend='openvino' is not supported .* backend='torch'"):
        check_backend("openvino")
    with pytest.raises(ValueError, match="a released checkpoint is not one: export it first"):
        check_backend("onnx", released=True)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), (torch.bfloat16, torch.bfloat16), ("float16", torch.float16), ("torch.float32", torch.float32)],
)
def test_dtype_names_and_dtypes(value, expected):
    assert resolve_dtype(value, {}) is expected


def test_auto_dtype_is_the_saved_one():
    assert resolve_dtype("auto", {"dtype": "bfloat16"}) is torch.bfloat16
    assert resolve_dtype("auto", {"torch_dtype": "float16"}) is torch.float16  # the older config key
    assert resolve_dtype("auto", {}) is None  # nothing recorded: the default dtype


@pytest.mark.parametrize("value", ["int8", torch.int64, "float17", 3])
def test_non_float_dtypes_are_refused(value):
    with pytest.raises(ValueError, match="not a floating-point torch dtype"):
        resolve_dtype(value, {})


def test_model_kwargs_split_and_the_ignored_keys_named():
    assert split_model_kwargs(None, "loader") == (None, None)
    assert split_model_kwargs({"torch_dtype": "float16", "attn_implementation": "sdpa"}, "loader") == (
        "float16",
        "sdpa",
    )
    # dtype wins over the older torch_dtype
    assert split_model_kwargs({"dtype": "bfloat16", "torch_dtype": "float16"}, "loader")[0] == "bfloat16"
    with pytest.warns(UserWarning, match=r"my loader ignores model_kwargs\['device_map'\], config_kwargs"):
        split_model_kwargs({"device_map": "auto"}, "my loader", config_kwargs={"a": 1}, processor_kwargs={})
