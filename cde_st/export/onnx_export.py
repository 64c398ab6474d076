"""Export a model to ONNX: a complete model folder whose graphs ONNX Runtime runs (``cde-st-convert --to onnx``).

A contextual model is saved as usual (torch weights, tokenizer, context) and gets ``onnx/first_stage.onnx`` and
``onnx/second_stage.onnx`` with the corpus context as an input (:mod:`cde_st.export.graphs`), so one export serves
every context; ``ContextualSentenceTransformer(folder, backend="onnx")`` loads it
(:mod:`cde_st.modules.onnx_runtime` says what the record checks). A plain sentence-transformers model whose first
module is a ``Transformer`` gets sentence-transformers' own layout, ``onnx/model.onnx`` (the encoder: token ids ->
``last_hidden_state``), which ``SentenceTransformer(folder, backend="onnx")`` loads where optimum is installed.

``quantize="int8"`` adds ONNX Runtime's dynamic int8 quantisation of every graph (``*_qint8.onnx``: weights int8
with one scale per output channel, activations quantised per batch), chosen at load with
``model_kwargs={"file_name": "second_stage_qint8.onnx"}``.
Every graph is checked after export: ONNX Runtime on a few texts against torch, the largest difference recorded.

Example:
    >>> from cde_st.export import export_onnx
    >>> export_onnx(model, "models/my-cde-onnx", quantize="int8")                # doctest: +SKIP
    >>> fast = ContextualSentenceTransformer("models/my-cde-onnx", backend="onnx")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

from cde_st.export.graphs import FirstStageGraph, SecondStageGraph
from cde_st.model import contextual_module, is_contextual
from cde_st.modules.context_attention import context_prefix, stacked_states
from cde_st.modules.onnx_runtime import EXPORT_FOLDER, RECORD_FILE, VARIANTS, file_digest, module_fingerprint

__all__ = ["QUANTIZATIONS", "SAMPLE_TEXTS", "export_onnx"]

logger = logging.getLogger(__name__)

#: What ``quantize=`` may be.
QUANTIZATIONS = ("int8",)
#: Texts the graphs are traced with and checked on (different lengths: batch and length stay dynamic).
SAMPLE_TEXTS = (
    "what causes rain?",
    "Contextual document embeddings read a sample of the corpus before they embed a document.",
    "a b c",
)
_FORMAT = 1


def export_onnx(model: SentenceTransformer, output: str | Path, quantize: str | None = None) -> Path:
    """Write ``model`` to the new folder ``output`` (absent or empty) with its ONNX graphs; returns the folder.

    ``quantize``: None, or "int8" for dynamically quantised copies of the graphs beside the float32 ones."""
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(f"quantize must be one of {QUANTIZATIONS} or None, got {quantize!r}.")
    output = Path(output).expanduser()
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise FileExistsError(f"{output} exists and is not empty; choose a new folder.")
    onnx = _import_onnx()
    model = model.to("cpu").eval()
    model.save(str(output))
    export = output / EXPORT_FOLDER
    export.mkdir(exist_ok=True)
    if not is_contextual(model):
        return _export_plain(model, export, quantize)
    module = contextual_module(model)
    features, context = _sample_inputs(module)
    graphs = {"first_stage": FirstStageGraph(module), "second_stage": SecondStageGraph(module)}
    args = {
        "first_stage": (features["input_ids"], features["attention_mask"], features.get("token_type_ids")),
        "second_stage": (features["input_ids"], features["attention_mask"], context, features.get("token_type_ids")),
    }
    variants: dict[str, dict[str, Any]] = {name: {} for name in _variants(quantize)}
    check = {}
    for stage, graph in graphs.items():
        path = export / f"{stage}.onnx"
        _trace(graph, args[stage], path, context_position=2 if stage == "second_stage" else None)
        check[stage] = _largest_difference(graph, args[stage], path)
        _add_variants(onnx, path, stage, variants)
    record = {
        "format": _FORMAT,
        "model_fingerprint": module_fingerprint(module),
        "context_input": "states" if graphs["second_stage"].reads_states else "prefix",
        "context_shape": list(context.shape),
        "context_size": module.context_size,
        "context_layers": module.config.context_layers,
        "check_max_abs_diff": check,
        "variants": variants,
        "versions": _versions(),
    }
    (export / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return output


def _import_onnx():
    try:
        import onnx
        import onnxruntime  # noqa: F401  (the export is checked with it)
        import onnxscript  # noqa: F401  (torch's ONNX exporter needs it)
    except ImportError as exc:
        raise ImportError(
            f"Exporting to ONNX needs {exc.name}: pip install 'cde-st[onnx]' (onnx, onnxruntime, onnxscript)."
        ) from None
    return onnx


@contextlib.contextmanager
def _quiet_exporters() -> Iterator[None]:
    """Without the exporters' notes on their own internals: torch's registry on optional packages (torchvision),
    ONNX Runtime's quantiser advising pre-processing (on the root logger), warnings about traced code."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx._internal.exporter._registration", "")]
    levels = [log.level for log in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for log in loggers:
            log.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for log, level in zip(loggers, levels):
                log.setLevel(level)


def _variants(quantize: str | None) -> list[str]:
    return ["fp32"] + (["qint8"] if quantize == "int8" else [])


@torch.no_grad()
def _sample_inputs(module: Any) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Tokenised :data:`SAMPLE_TEXTS` and the context input of the second-stage graph (the active context's, else
    the null context's)."""
    features = module.preprocess(list(SAMPLE_TEXTS))
    features = {k: v for k, v in features.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    vectors = module.context_vectors
    if vectors is None:
        vectors = module.null_vector.new_zeros(0, module.hidden_size)
    config = module.config
    prefix = context_prefix(vectors.clone(), module.null_vector, module.soft_prompt, config, False, torch.float32)
    if not SecondStageGraph(module).reads_states:
        return features, prefix.clone()
    states = module.second_adapter.context_states(module.second_stage, prefix, config.context_layers)
    return features, stacked_states(states).clone()


def _trace(graph: torch.nn.Module, args: tuple, path: Path, context_position: int | None) -> None:
    """torch's ONNX exporter over ``graph``: batch and length dynamic, the context's shape fixed."""
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    text = {0: batch, 1: length}
    names = ["input_ids", "attention_mask", "token_type_ids"]
    if context_position is not None:
        names.insert(context_position, "context")
    present = [name for name, arg in zip(names, args) if arg is not None]
    shapes = tuple(None if name == "context" else text for name, arg in zip(names, args) if arg is not None)
    args = tuple(arg for arg in args if arg is not None)
    output = "context_vectors" if context_position is None else "token_embeddings"
    with _quiet_exporters(), torch.no_grad():
        torch.onnx.export(
            graph.eval(),
            args,
            str(path),
            input_names=present,
            output_names=[output],
            dynamic_shapes=shapes,
            dynamo=True,
            external_data=False,
            verbose=False,
        )


@torch.no_grad()
def _largest_difference(graph: torch.nn.Module, args: tuple, path: Path) -> float:
    """Run the exported graph on the sample inputs: the largest absolute difference from torch."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    present = [arg for arg in args if arg is not None]
    (got,) = session.run(None, {name: arg.numpy() for name, arg in zip(names, present)})
    expected = graph(*args).numpy()
    if got.shape != expected.shape:
        raise RuntimeError(f"The exported {path.name} gives shape {got.shape}, torch {expected.shape}.")
    return float(np.abs(got - expected).max())


def _add_variants(onnx: Any, path: Path, stage: str, variants: dict[str, dict[str, Any]]) -> None:
    """Record ``path`` (fp32) and write and record its quantised copies."""
    for variant in variants:
        target = path.with_name(f"{path.stem}{VARIANTS[variant]}.onnx")
        if variant == "qint8":
            _quantize_int8(onnx, path, target)
        variants[variant][stage] = {"file": target.name, "sha256": file_digest(target)}


def _quantize_int8(onnx: Any, source: Path, target: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # The exporter's graphs carry value types ONNX Runtime's shape inference may not reach; float is their default.
    options = {"DefaultTensorType": onnx.TensorProto.FLOAT}
    # One scale per output channel: with one per weight matrix, the mini recipe's document embeddings kept a mean
    # cosine of 0.949 to torch's on SciFact (per channel: 0.994).
    with _quiet_exporters():
        quantize_dynamic(
            str(source), str(target), weight_type=QuantType.QInt8, per_channel=True, extra_options=options
        )


def _export_plain(model: SentenceTransformer, export: Path, quantize: str | None) -> Path:
    """sentence-transformers' layout for a plain model: ``onnx/model.onnx``, the first module's encoder."""
    first = model[0]
    encoder = getattr(first, "auto_model", None) or getattr(first, "model", None)
    if encoder is None:
        raise ValueError(f"{type(first).__name__} has no encoder to export; only Transformer-based models export.")
    features = first.preprocess(list(SAMPLE_TEXTS))
    args = (features["input_ids"], features["attention_mask"], features.get("token_type_ids"))
    graph = _LastHiddenState(encoder)
    path = export / "model.onnx"
    _trace(graph, args, path, context_position=None)
    _rename_output(path, "last_hidden_state")
    logger.info("%s: largest difference from torch %.2e", path, _largest_difference(graph, args, path))
    if quantize == "int8":
        _quantize_int8(_import_onnx(), path, path.with_name("model_qint8.onnx"))
    return export.parent


class _LastHiddenState(torch.nn.Module):
    def __init__(self, encoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        kwargs = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state


def _rename_output(path: Path, name: str) -> None:
    import onnx

    graph = onnx.load(str(path))
    old = graph.graph.output[0].name
    for node in graph.graph.node:
        node.output[:] = [name if out == old else out for out in node.output]
    graph.graph.output[0].name = name
    onnx.save(graph, str(path))


def _versions() -> dict[str, str]:
    names = ("torch", "onnx", "onnxruntime", "onnxscript", "transformers", "cde-st")
    found = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found
