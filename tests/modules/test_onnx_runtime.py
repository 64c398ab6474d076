"""Opening an export's graphs for a module (cde_st.modules.onnx_runtime), on a hand-made export record: every way a
folder's graphs can fail to be the ones exported from the weights beside them is refused, naming the file. (The
graphs themselves, run against torch: tests/export/test_onnx_export.py.)"""

from __future__ import annotations

import hashlib
import json

import pytest

from cde_st.modules.onnx_runtime import (
    EXPORT_FOLDER,
    RECORD_FILE,
    OnnxRuntime,
    file_digest,
    module_fingerprint,
    onnx_runtime_options,
)

pytest.importorskip("onnxruntime")


@pytest.fixture
def module(make_tiny_cde):
    return make_tiny_cde(context_size=4)[0]


def _export(folder, module, fingerprint=None, graphs=None):
    """A fake export: graph files of a few bytes (no session can open them: only the checks before are tested
    here) and a record listing them with their digests."""
    export = folder / EXPORT_FOLDER
    export.mkdir(parents=True)
    variants = {}
    for variant, suffix in (("fp32", ""), ("qint8", "_qint8")):
        variants[variant] = {}
        for stage in ("first_stage", "second_stage"):
            name = f"{stage}{suffix}.onnx"
            (export / name).write_bytes(name.encode())
            variants[variant][stage] = {"file": name, "sha256": hashlib.sha256(name.encode()).hexdigest()}
    record = {"model_fingerprint": fingerprint or module_fingerprint(module), "variants": graphs or variants}
    (export / RECORD_FILE).write_text(json.dumps(record))
    return export


def test_the_variant_is_the_one_whose_second_stage_graph_is_named(module, tmp_path):
    from cde_st.modules.onnx_runtime import _variant_of

    variants = json.loads((_export(tmp_path, module) / RECORD_FILE).read_text())["variants"]
    assert _variant_of(None, variants, tmp_path) == "fp32"
    assert _variant_of("second_stage_qint8.onnx", variants, tmp_path) == "qint8"
    assert _variant_of("/elsewhere/second_stage.onnx", variants, tmp_path) == "fp32"  # the file's name counts


def test_no_export_or_a_garbled_record(module, tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"has no ONNX export \({EXPORT_FOLDER}/{RECORD_FILE} is missing\)"):
        OnnxRuntime.open(tmp_path, module)
    (tmp_path / EXPORT_FOLDER).mkdir()
    (tmp_path / EXPORT_FOLDER / RECORD_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="is not a cde_st export record"):
        OnnxRuntime.open(tmp_path, module)


def test_a_graph_the_record_does_not_list_is_refused_naming_the_listed_ones(module, tmp_path):
    _export(tmp_path, module)
    with pytest.raises(ValueError, match=r"file_name='second_stage_fp16.onnx' is not one of the graphs .*qint8"):
        OnnxRuntime.open(tmp_path, module, file_name="second_stage_fp16.onnx")


def test_graphs_of_another_model_are_refused(module, tmp_path):
    _export(tmp_path, module, fingerprint="0" * 16)
    with pytest.raises(ValueError, match=r"exported from another model \(fingerprint 0000000000000000\)"):
        OnnxRuntime.open(tmp_path, module)


def test_a_missing_or_replaced_graph_is_named(module, tmp_path):
    export = _export(tmp_path, module)
    (export / "second_stage.onnx").write_bytes(b"another graph")
    with pytest.raises(ValueError, match=r"second_stage.onnx is not the graph .* records .*replaced or damaged"):
        OnnxRuntime.open(tmp_path, module)
    (export / "second_stage.onnx").unlink()
    with pytest.raises(FileNotFoundError, match=r"second_stage.onnx is missing \(listed in"):
        OnnxRuntime.open(tmp_path, module)


def test_onnx_runtime_options_are_split_from_the_rest(tmp_path):
    options, rest = onnx_runtime_options({"file_name": "g.onnx", "provider": "CPUExecutionProvider", "dtype": "auto"})
    assert options == {"file_name": "g.onnx", "provider": "CPUExecutionProvider"} and rest == {"dtype": "auto"}
    assert onnx_runtime_options(None) == ({}, {})
    (tmp_path / "f").write_bytes(b"abc")
    assert file_digest(tmp_path / "f") == hashlib.sha256(b"abc").hexdigest()
