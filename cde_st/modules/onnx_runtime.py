"""ONNX Runtime in place of torch for a contextual module's two stages: the graphs ``cde-st-convert --to onnx`` writes.

An exported model folder is a complete cde_st model folder (the torch weights, tokenizer and context) plus
``onnx/``: ``first_stage.onnx`` (token ids -> context vectors) and ``second_stage.onnx`` (token ids and the corpus
context -> text states), optionally their dynamically quantised ``*_qint8.onnx``, and ``cde_st_export.json``, the
record of the export (:data:`RECORD_FILE`). The context is an input of the second-stage graph, so one export serves
every context: the ``(P, d)`` prefix rows, or in cached mode their per-layer keys/values stacked as
``(R, 2, heads, P, head_dim)`` for the R layers that read them (computed by torch once per context, as in torch).
Everything around the two graphs (tokenisation, sampling, the context's lifecycle, pooling, heads) is the module's
own torch code, so a model loaded with ``backend="onnx"`` has the torch model's every method and check.

Loading checks the folder against the torch weights beside it: the record's model fingerprint (weights and
architecture) must be the loaded module's, and each graph file's SHA-256 the recorded one; anything else is a
ValueError naming both values (a graph of another model, another J or other reading layers never runs silently).

Threads: ONNX Runtime ignores torch's setting, so each session gets ``torch.get_num_threads()`` intra-op threads
(which follows ``OMP_NUM_THREADS`` and ``torch.set_num_threads``) unless ``session_options`` say otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cde_st.modules.context_attention import stacked_states
from cde_st.modules.freshness import embedding_fingerprint

__all__ = [
    "EXPORT_FOLDER",
    "RECORD_FILE",
    "VARIANTS",
    "OnnxRuntime",
    "file_digest",
    "module_fingerprint",
    "onnx_runtime_options",
]

#: The subfolder of a model folder that holds the graphs (sentence-transformers' layout).
EXPORT_FOLDER = "onnx"
#: The record of an export: format, model fingerprint, context input, graph files and their SHA-256.
RECORD_FILE = "cde_st_export.json"
#: Graph variants an export may hold: ``fp32`` always, ``qint8`` with ``--quantize int8``.
VARIANTS = {"fp32": "", "qint8": "_qint8"}
#: Config fields a load may set without changing what the graphs compute.
_LOAD_TIME_FIELDS = ("attn_implementation", "max_seq_length", "context_max_seq_length")
_ONNX_OPTIONS = ("file_name", "provider", "session_options")


def module_fingerprint(module: Any) -> str:
    """What an export must match: the module's weights and its architecture (the config less load-time fields)."""
    config = {k: v for k, v in module.config.to_dict().items() if k not in _LOAD_TIME_FIELDS}
    return embedding_fingerprint(None, list(module.parameters()), config)


def file_digest(path: str | Path) -> str:
    """SHA-256 (hex) of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def onnx_runtime_options(model_kwargs: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``model_kwargs`` of a ``backend="onnx"`` load split into ONNX Runtime's options (``file_name``,
    ``provider``, ``session_options``) and the rest (for the torch module, e.g. nothing or ``dtype``)."""
    model_kwargs = dict(model_kwargs or {})
    return {k: model_kwargs.pop(k) for k in _ONNX_OPTIONS if k in model_kwargs}, model_kwargs


def _import_onnxruntime():
    try:
        import onnxruntime
    except ImportError:
        raise ImportError(
            "backend='onnx' needs ONNX Runtime: pip install 'cde-st[onnx]' (onnxruntime, onnx, onnxscript)."
        ) from None
    return onnxruntime


class OnnxRuntime:
    """The two exported graphs of one model folder, as ONNX Runtime sessions (see the module docstring).

    Open one with :meth:`open`; a :class:`~cde_st.modules.contextual_transformer.ContextualTransformer` whose
    ``runtime`` is set runs its first stage through :meth:`first_stage` and its second stage's layers through
    :meth:`second_stage`."""

    def __init__(self, paths: dict[str, str], record: dict[str, Any], variant: str, identity: str, options) -> None:
        self.paths = paths  # stage -> graph file
        self.record = record
        self.variant = variant
        #: Hash of the graphs in use: what an embedding cache or a stored context must also match.
        self.identity = identity
        self.reads_states = record["context_input"] == "states"
        self._options = options  # (provider, session options or None)
        self._open_sessions()

    def _open_sessions(self) -> None:
        ort = _import_onnxruntime()
        provider, options = self._options
        if options is None:
            options = ort.SessionOptions()
            options.intra_op_num_threads = torch.get_num_threads()
        providers = [provider or "CPUExecutionProvider"]
        self.sessions = {
            stage: ort.InferenceSession(path, options, providers=providers) for stage, path in self.paths.items()
        }
        self._inputs = {stage: [i.name for i in s.get_inputs()] for stage, s in self.sessions.items()}
        self._stacked: tuple[list, np.ndarray] | None = None  # the last cached keys/values, stacked

    @property
    def file_name(self) -> str:
        """The second stage's graph file (what ``model_kwargs={"file_name": ...}`` chose)."""
        return os.path.basename(self.paths["second_stage"])

    def __getstate__(self) -> dict[str, Any]:
        # Sessions do not pickle (a multi-process pool or a Ray actor gets a copy of the model): each copy opens the
        # same files again, with its own process's thread setting when no session options were given.
        state = {k: v for k, v in self.__dict__.items() if k not in ("sessions", "_inputs", "_stacked")}
        state["_options"] = (self._options[0], None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open_sessions()

    @classmethod
    def open(
        cls,
        folder: str | Path,
        module: Any,
        file_name: str | None = None,
        provider: str | None = None,
        session_options: Any = None,
    ) -> OnnxRuntime:
        """The sessions of ``folder``'s export for ``module`` (the torch module loaded from the same folder).

        ``file_name``: the second stage's graph, ``second_stage.onnx`` (default) or ``second_stage_qint8.onnx``
        (the first stage of the same variant goes with it). ``provider``: an ONNX Runtime execution provider
        (default ``CPUExecutionProvider``). ``session_options``: an ``onnxruntime.SessionOptions``."""
        _import_onnxruntime()
        export = Path(folder) / EXPORT_FOLDER
        record_path = export / RECORD_FILE
        if not record_path.is_file():
            raise FileNotFoundError(
                f"{folder} has no ONNX export ({EXPORT_FOLDER}/{RECORD_FILE} is missing): write one with "
                f"`cde-st-convert {folder} OUT --to onnx`, or load the folder with backend='torch'."
            )
        try:
            record = json.loads(record_path.read_text(encoding="utf-8"))
            variants = record["variants"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{record_path} is not a cde_st export record ({exc}); export the model again.") from None
        variant = _variant_of(file_name, variants, record_path)
        expected, actual = record.get("model_fingerprint"), module_fingerprint(module)
        if expected != actual:
            raise ValueError(
                f"The ONNX graphs in {export} were exported from another model (fingerprint {expected}) than the "
                f"weights and config beside them ({actual}): export this model again with `cde-st-convert`."
            )
        paths, digests = {}, []
        for stage, entry in variants[variant].items():
            path = export / entry["file"]
            if not path.is_file():
                raise FileNotFoundError(f"{path} is missing (listed in {record_path}); export the model again.")
            digest = file_digest(path)
            if digest != entry["sha256"]:
                raise ValueError(
                    f"{path} is not the graph {record_path} records (SHA-256 {digest[:16]}..., recorded "
                    f"{entry['sha256'][:16]}...): it was replaced or damaged; export the model again."
                )
            paths[stage] = os.fspath(path)
            digests.append(digest)
        identity = hashlib.sha256("".join(digests).encode()).hexdigest()[:16]
        return cls(paths, record, variant, identity, (provider, session_options))

    def check_weights(self, module: Any) -> None:
        """Refuse to run once the torch weights differ from those exported (an edit or training after loading):
        the graphs would compute the old model."""
        if module_fingerprint(module) != self.record["model_fingerprint"]:
            raise ValueError(
                "The model's torch weights changed after its ONNX export was loaded; the graphs compute the "
                "exported weights. Export again (cde-st-convert --to onnx) or load with backend='torch'."
            )

    def _feed(self, stage: str, features: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        return {
            name: features[name].detach().cpu().numpy().astype(np.int64, copy=False)
            for name in self._inputs[stage]
            if name != "context"
        }

    def first_stage(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        """(n, L) token ids of context documents -> (n, d) context vectors."""
        (vectors,) = self.sessions["first_stage"].run(None, self._feed("first_stage", features))
        return torch.from_numpy(vectors).to(features["input_ids"].device)

    def second_stage(
        self,
        features: dict[str, torch.Tensor],
        prefix: torch.Tensor,
        cached: list[tuple[torch.Tensor, torch.Tensor] | None] | None,
    ) -> torch.Tensor:
        """(B, L) token ids and the (P, d) prefix (or, when :attr:`reads_states`, its per-layer keys/values) ->
        (B, L, d) text states."""
        feed = self._feed("second_stage", features)
        feed["context"] = self._stack(cached) if self.reads_states else prefix.detach().float().cpu().numpy()
        (states,) = self.sessions["second_stage"].run(None, feed)
        return torch.from_numpy(states).to(features["input_ids"].device)

    def _stack(self, cached: list[tuple[torch.Tensor, torch.Tensor] | None]) -> np.ndarray:
        """The reading layers' keys/values as one (R, 2, H, P, hd) array, kept while the same cached list is read."""
        if self._stacked is None or self._stacked[0] is not cached:
            self._stacked = (cached, stacked_states(cached).detach().float().cpu().numpy())
        return self._stacked[1]


def _variant_of(file_name: str | None, variants: dict[str, Any], record_path: Path) -> str:
    """The variant whose second-stage graph is ``file_name`` (None: fp32)."""
    if file_name is None:
        return "fp32"
    for variant, stages in variants.items():
        if stages["second_stage"]["file"] == os.path.basename(file_name):
            return variant
    files = [stages["second_stage"]["file"] for stages in variants.values()]
    raise ValueError(f"model_kwargs file_name={file_name!r} is not one of the graphs {record_path} lists: {files}.")
