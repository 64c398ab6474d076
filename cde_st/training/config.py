"""Training recipe: one config, presets, data loading and the SentenceTransformerTrainer wiring.

``train/train_cde.py`` and the ``cde-st-train`` command are thin over :func:`train`. The same function trains a
contextual model, or a plain bi-encoder baseline (``model: biencoder``) with identical data, batching and loss.

    cfg = TrainConfig.from_preset("mini", output_dir="runs/mini-cde")
    model = train(cfg)
"""

from __future__ import annotations

import dataclasses
import difflib
import glob
import gzip
import json
import logging
import math
import os
import re
import shutil
import time
import types
import typing
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

SHARED_PAIRS = Path(__file__).resolve().parents[2] / "shared" / "data" / "pairs"


class TrainConfigError(ValueError):
    """A training config field with an unknown name, a value of the wrong type, or an unsupported choice."""


# Fields whose value must be one of a few names (checked with the types).
_CHOICES: dict[str, tuple[Any, ...]] = {
    "model": ("contextual", "biencoder", "continue"),
    "batching": ("clustered", "random"),
    "surrogate_kind": ("transformer", "static"),
    "bf16": (True, False, "auto"),
}


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _coerce(value: Any, hint: Any, name: str) -> Any:
    """``value`` as type ``hint``, converting only where the intent is unambiguous (``"1e-3"`` -> float, ``4.0``
    -> int, one path -> ``[path]`` for a list); a ``TypeError`` naming field ``name``, the value and ``hint``
    otherwise."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    mismatch = TypeError(f"field {name!r} = {_describe(value)}: expected {_type_name(hint)}")
    if hint is Any:
        return value
    if hint is type(None):
        if value is None:
            return None
        raise mismatch
    if origin in (typing.Union, types.UnionType):
        exact = [a for a in args if a is not Any and isinstance(value, typing.get_origin(a) or a)]
        exact = [a for a in exact if not (isinstance(value, bool) and a in (int, float))]
        for candidate in exact + [a for a in args if a not in exact]:
            try:
                return _coerce(value, candidate, name)
            except TypeError:
                continue
        raise mismatch
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
    elif hint is str:
        if isinstance(value, str):
            return value
    elif origin is list:
        (item_hint,) = args or (Any,)
        if isinstance(value, str) and item_hint is str:
            return [value]  # one path/name where a list is expected
        if isinstance(value, (list, tuple)):
            return [_coerce(v, item_hint, f"{name}[{i}]") for i, v in enumerate(value)]
    elif origin is dict:
        key_hint, value_hint = args or (Any, Any)
        if isinstance(value, dict):
            return {
                _coerce(k, key_hint, f"{name} key {k!r}"): _coerce(v, value_hint, f"{name}[{k!r}]")
                for k, v in value.items()
            }
    else:  # a hint this checker does not know: leave the value alone
        return value
    raise mismatch


def _type_name(hint: Any) -> str:
    if hint is type(None):
        return "null"
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if typing.get_origin(hint) is list:
        return f"a list of {_type_name(typing.get_args(hint)[0])} (or one {_type_name(typing.get_args(hint)[0])})"
    if typing.get_origin(hint) is dict:
        return "a dict (mapping)"
    return getattr(hint, "__name__", str(hint))


def _positive_or_none(value: Any) -> bool:
    return value is None or value >= 1


# What each numeric field accepts beyond its type (a value outside would be silently misread or break late):
# field -> (accepts(value), what it must be).
_RANGES: dict[str, tuple[Any, str]] = {
    "seed": (lambda v: 0 <= v < 2**32, "must be in [0, 2**32 - 1] (numpy, torch and faiss seeds are unsigned)"),
    "context_size": (lambda v: v >= 0, "must be >= 0 (0: no context slots)"),
    "max_seq_length": (lambda v: v >= 1, "must be >= 1"),
    "max_pairs": (_positive_or_none, "must be >= 1, or null for all pairs"),
    "cluster_size": (_positive_or_none, "must be >= 1, or null for the batch size (the paper's choice)"),
    "batch_size": (lambda v: v >= 1, "must be >= 1"),
    "mini_batch_size": (_positive_or_none, "must be >= 1, or null for no gradient caching"),
    "context_mini_batch_size": (_positive_or_none, "must be >= 1, or null for mini_batch_size"),
    "eval_steps": (_positive_or_none, "must be >= 1, or null to evaluate only at the end"),
    "eval_max_corpus": (_positive_or_none, "must be >= 1, or null for the whole corpus"),
    "save_steps": (lambda v: v >= 1, "must be >= 1"),
    "logging_steps": (lambda v: v >= 1, "must be >= 1"),
    "temperature": (lambda v: math.isfinite(v) and v > 0, "must be a finite number > 0"),
    "learning_rate": (lambda v: math.isfinite(v) and v > 0, "must be a finite number > 0"),
    "added_params_lr": (
        lambda v: v is None or (math.isfinite(v) and v >= 0),
        "must be a finite number >= 0 (0 freezes the added parameters), or null for learning_rate",
    ),
    # Guide scores are cosines in [-1, 1]: a candidate is filtered when f(q, d_j) >= f(q, d+) - margin, so a margin
    # of 2 or more filters every in-batch negative (loss 0, nothing learned) and one of -2 or less none.
    "margin": (
        lambda v: math.isfinite(v) and -2 < v < 2,
        "must be a finite number in (-2, 2): guide scores are cosines, so a margin >= 2 filters every negative "
        "(0: filter candidates at least as relevant as the positive; to turn filtering off set "
        "filter_false_negatives: false)",
    ),
    "context_dropout": (lambda v: 0 <= v <= 1, "must be in [0, 1]"),
    "weight_decay": (lambda v: math.isfinite(v) and v >= 0, "must be a finite number >= 0"),
    "warmup_steps": (lambda v: v >= 0, "must be >= 0"),
    "num_train_epochs": (lambda v: math.isfinite(v) and v > 0, "must be a finite number > 0"),
    "dataloader_num_workers": (lambda v: v >= 0, "must be >= 0"),
}


def _range_problem(key: str, value: Any) -> str | None:
    """What is wrong with an already type-checked ``value`` of field ``key`` (None: nothing)."""
    if key in _RANGES:
        accepts, rule = _RANGES[key]
        return None if accepts(value) else rule
    return None


def _checked_model_config(values: dict[str, Any]) -> dict[str, Any]:
    """``model_config`` checked against :class:`ContextualTransformer`'s arguments and coerced to their types: known
    names, the right types (a string ``"false"`` is not a boolean, 2.5 is not an int), and no option that has a
    TrainConfig field of its own. A ``TypeError`` says what is wrong."""
    from cde_st.modules.contextual_transformer import ContextualTransformer

    own = {"context_size": "context_size", "max_seq_length": "max_seq_length"}
    own.update(query_prompt="query_prompt", document_prompt="document_prompt")
    hints = typing.get_type_hints(ContextualTransformer.__init__)
    allowed = [k for k in ContextualTransformer.config_keys if k not in own]
    checked = {}
    for key, value in values.items():
        if key in own:
            raise TypeError(
                f"model_config.{key}: {key} is a TrainConfig field of its own; set {own[key]}: {value!r} instead"
            )
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"model_config: unknown ContextualTransformer option {key!r}.{hint} Known: {allowed}")
        checked[key] = _coerce(value, hints[key], f"model_config.{key}")
    return checked


@dataclass
class TrainConfig:
    """Every knob of a training run. Defaults are the paper's where the paper has one."""

    # ---- model
    model: str = "contextual"  # "contextual", "biencoder", or "continue" (from init_from)
    base_model: str = "minilm"  # HF id / folder / sentence-transformers folder; "minilm" (offline), "tiny" (random)
    init_from: str | None = None  # a saved cde_st or sentence-transformers model to continue from
    context_size: int = 512
    max_seq_length: int = 512
    model_config: dict[str, Any] = field(default_factory=dict)  # extra ContextualTransformer fields
    query_prompt: str | None = None  # None: "search_query: " for contextual models, "" for bi-encoders
    document_prompt: str | None = None  # None: "search_document: " for contextual models, "" for bi-encoders
    # ---- data
    train_data: list[str] = field(default_factory=lambda: [str(SHARED_PAIRS)])
    exclude_domains: list[str] = field(default_factory=list)
    max_pairs: int | None = None
    domain_prompts: dict[str, dict[str, str]] = field(default_factory=dict)  # {domain: {"query":..,"document":..}}
    # ---- batching
    batching: str = "clustered"  # "clustered" (contextual batches) or "random"
    cluster_size: int | None = None  # None: the batch size (paper)
    surrogate: str | None = None  # clustering model; None: offline all-MiniLM-L6-v2; "tiny": the tiny base encoder
    # "transformer": `surrogate` embeds every pair. "static": a static model distilled from `surrogate` (model2vec,
    # once, cached) and fitted to it on 4,096 pairs embeds them: minutes instead of hours for 1M pairs on a CPU,
    # slightly easier batches (benchmarks/RESULTS_sampler.md); needs pip install 'cde_st[fast-surrogate]'.
    surrogate_kind: str = "transformer"
    # ---- loss
    filter_false_negatives: bool = True
    guide: str | None = None  # filtering model; None: offline all-MiniLM-L6-v2; "tiny": the tiny base encoder
    temperature: float = 0.02
    margin: float = 0.0
    bidirectional: bool = False
    mini_batch_size: int | None = None  # gradient caching (second stage)
    context_mini_batch_size: int | None = None  # gradient caching (first stage)
    context_dropout: float = 0.0  # per batch, probability of a random partial/empty context (FilteredInfoNCELoss)
    gather_across_devices: bool = False  # data-parallel: other ranks' rows as extra (cross-rank) negatives
    leave_one_out: bool = False  # hide each pair's own document from it in the training context (FilteredInfoNCELoss)
    # ---- optimisation
    batch_size: int = 512
    learning_rate: float = 2e-5
    added_params_lr: float | None = None  # lr of what cde_st adds to the encoders (gates, heads, null); None: same
    warmup_steps: int = 1000
    num_train_epochs: float = 1.0
    max_steps: int = -1
    weight_decay: float = 0.01
    bf16: bool | str = "auto"  # "auto": on for CUDA devices that support it
    seed: int = 42
    # ---- evaluation, checkpoints, logging
    eval_folder: str | None = None  # a BEIR folder scored with context during training
    eval_split: str = "test"
    eval_steps: int | None = None  # None: only at the end
    eval_max_corpus: int | None = None
    output_dir: str | None = None  # None: runs/PRESET-MODEL-sSEED (see default_output_dir)
    save_steps: int = 500
    save_total_limit: int = 2
    logging_steps: int = 10
    dataloader_num_workers: int = 0

    def __post_init__(self) -> None:
        # Direct construction (``TrainConfig(learning_rate="1e-3")``) gets the same checks as configs read from files.
        for key, value in self.check_values(self.to_dict(), "TrainConfig(...)").items():
            object.__setattr__(self, key, value)
        if self.output_dir is None:
            self.output_dir = default_output_dir(None, self.model, self.seed)
        if self.model_config and self.model != "contextual":
            what = "a bi-encoder has no context options" if self.model == "biencoder" else (
                "a continued model keeps the options it was saved with"
            )
            raise TrainConfigError(
                f"model_config {self.model_config} only applies to model: contextual, but model is {self.model!r} "
                f"({what}); remove model_config."
            )

    @classmethod
    def check_values(cls, values: dict[str, Any], source: str, lines: dict[str, int] | None = None) -> dict[str, Any]:
        """``values`` checked against the fields' type hints and coerced where unambiguous (``"1e-3"`` -> 1e-3,
        a single path -> ``[path]``); a :class:`TrainConfigError` names the source (``lines``: the line of each key
        in a file), the field, the value and the expected type, or the unknown field."""
        hints = typing.get_type_hints(cls)

        def at(key: str) -> str:
            return f"{source}, line {lines[key]}" if lines and key in lines else source

        checked = {}
        for key, value in values.items():
            if key not in hints:
                close = difflib.get_close_matches(str(key), hints, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise TrainConfigError(
                    f"{at(key)}: unknown training config field {key!r}.{hint} Known fields: {sorted(hints)}."
                )
            try:
                value = _coerce(value, hints[key], key)
                if key == "model_config":
                    value = _checked_model_config(value)
            except TypeError as err:
                raise TrainConfigError(f"{at(key)}: {err}.") from None
            if key in _CHOICES and value not in _CHOICES[key]:
                raise TrainConfigError(f"{at(key)}: field {key!r} = {value!r}: expected one of {list(_CHOICES[key])}.")
            problem = _range_problem(key, value)
            if problem:
                raise TrainConfigError(f"{at(key)}: field {key!r} = {value!r}: {problem}.")
            checked[key] = value
        return checked

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> TrainConfig:
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}; choose from {sorted(PRESETS)}.")
        values = cls.check_values(PRESETS[name], f"preset {name!r}")
        overrides = cls.check_values(overrides, "overrides")
        if overrides.get("model", values.get("model", "contextual")) != "contextual" and "model_config" not in overrides:
            values.pop("model_config", None)  # the preset's contextual options; a bi-encoder has none
        values = {**values, **overrides}
        if "output_dir" not in values:
            values["output_dir"] = default_output_dir(name, values.get("model", "contextual"), values.get("seed", 42))
        return cls.from_dict(values)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "training config") -> TrainConfig:
        return cls(**cls.check_values(values, source))

    @classmethod
    def read_file(cls, path: str | os.PathLike) -> dict[str, Any]:
        """The fields of a YAML or JSON config file (a ``preset:`` key names the preset to start from), checked
        against the field types; errors name the file and line."""
        import yaml

        if not os.path.exists(path):
            raise FileNotFoundError(f"Training config {path} does not exist.")
        if os.path.isdir(path):
            raise TrainConfigError(f"Training config {path} is a folder; give a YAML or JSON file (--config FILE).")
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as err:
            line = err.object[: err.start].count(b"\n") + 1
            raise TrainConfigError(
                f"{path}, line {line}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}); "
                "save the config as UTF-8 YAML or JSON."
            ) from None
        try:
            values = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
        except json.JSONDecodeError as err:
            raise TrainConfigError(
                f"{path}, line {err.lineno}: invalid JSON: {err.msg} (column {err.colno})."
            ) from None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f"{path}, line {mark.line + 1}" if mark is not None else str(path)
            raise TrainConfigError(f"{where}: invalid YAML: {getattr(err, 'problem', None) or err}.") from None
        if values is not None and not isinstance(values, dict):
            raise TrainConfigError(f"{path}: expected a mapping of config fields, got {type(values).__name__}.")
        values = dict(values or {})
        lines = _key_lines(text)
        preset = values.pop("preset", None)
        if preset is not None and preset not in PRESETS:
            where = f"{path}, line {lines['preset']}" if "preset" in lines else str(path)
            raise TrainConfigError(f"{where}: unknown preset {preset!r}; choose from {sorted(PRESETS)}.")
        values = cls.check_values(values, str(path), lines)
        return {"preset": preset, **values} if preset is not None else values

    @classmethod
    def from_file(cls, path: str | os.PathLike, **overrides: Any) -> TrainConfig:
        """Load a YAML or JSON config; a ``preset:`` key starts from that preset; ``overrides`` win."""
        values = {**cls.read_file(path), **cls.check_values(overrides, "overrides")}
        preset = values.pop("preset", None)
        return cls.from_preset(preset, **values) if preset else cls.from_dict(values, str(path))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def default_output_dir(preset: str | None, model: str, seed: int) -> str:
    """The output folder of a run that names none: ``runs/PRESET-MODEL-sSEED`` (``runs/MODEL-sSEED`` without a
    preset), so that runs of different presets, model kinds or seeds never write into the same folder."""
    return f"runs/{preset + '-' if preset else ''}{model}-s{seed}"


def _key_lines(text: str) -> dict[str, int]:
    """1-based line of each top-level key of a YAML/JSON mapping (empty when the text does not compose)."""
    import yaml

    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {key.value: key.start_mark.line + 1 for key, _ in node.value if isinstance(key, yaml.ScalarNode)}


PRESETS: dict[str, dict[str, Any]] = {
    # A tiny random BERT with its own generated tokenizer and a few generated pairs (time: PRESET_TIMES); it also
    # clusters the batches and filters false negatives, so the preset needs no downloaded model. Tests and CI.
    "tiny": dict(
        base_model="tiny",
        surrogate="tiny",
        guide="tiny",
        context_size=8,
        max_seq_length=32,
        train_data=["builtin:tiny"],
        batch_size=8,
        cluster_size=8,
        max_steps=4,
        warmup_steps=0,
        learning_rate=1e-3,
        logging_steps=1,
        save_steps=2,
    ),
    # The paper's small ablation setting on the shared pairs, sized for a 2-core CPU (time: PRESET_TIMES):
    # 6-layer MiniLM, length 64, 64 context documents, batch = cluster = 64, one epoch over a seeded
    # 4,096-pair sample of the 30k out-of-domain pairs (64 steps; all 30k take ~7x longer: set max_pairs: null).
    "mini": dict(
        base_model="minilm",
        context_size=64,
        max_seq_length=64,
        train_data=[str(SHARED_PAIRS)],
        exclude_domains=["scifact_train"],
        max_pairs=4096,
        batch_size=64,
        cluster_size=64,
        learning_rate=5e-5,
        warmup_steps=6,
        num_train_epochs=1.0,
        save_steps=200,
        logging_steps=20,
        # The contextual recipe measured best so far (docs/RESULTS.md, issues 11-12: "dgc2u"): starts as MiniLM
        # (zero-initialised context gate, cached context read by the top 3 of 6 layers, no added heads), learns
        # partial and empty contexts, so it holds its quality at every J (J = 0: 65.2 vs 34.0 for the plain joint
        # recipe), is within 0.21 of joint attention on SciFact over three seeds, and encodes at 0.87-0.90x the
        # bi-encoder's speed at J = 512. It does not beat the bi-encoder baseline (--set model=biencoder) yet: on
        # these 4,096 pairs it is below it, on all 30k (--set max_pairs=null) level with it on SciFact and the
        # six-task average; what was tried (data mix, leave_one_out, J = batch = 128, cluster sizes, the plain
        # joint read, in-domain pairs, ...) is in docs/RESULTS.md.
        model_config={
            "context_gate": True,
            "context_attention": "cached",
            "context_layers": [3, 4, 5],
            "output_head": "none",
            "first_stage_head": "none",
        },
        context_dropout=0.5,
        added_params_lr=0.02,
    ),
    # The paper's main setting (8 GPUs): batch = cluster = 512, J = 512, length 512, lr 2e-5, 1000 warm-up steps,
    # gradient caching to fit the batch. The paper's surrogates were GTR-base (clustering) and nomic-embed-v1
    # (filtering); set `surrogate` / `guide` to use them.
    "paper": dict(
        base_model="google-bert/bert-base-uncased",  # the hub id of bert-base-uncased (owner/name)
        model_config={"context_attention": "joint"},  # the paper's attention (from_encoder defaults to cached + gate)
        context_size=512,
        max_seq_length=512,
        batch_size=512,
        cluster_size=512,
        learning_rate=2e-5,
        warmup_steps=1000,
        mini_batch_size=64,
        context_mini_batch_size=64,
        bf16="auto",
        save_steps=1000,
    ),
}

# One measured train wall time per preset (what `cde-st-train --help` shows), with the machine it was measured on.
PRESET_TIMES: dict[str, str] = {
    "tiny": "17 s of training, 37 s for the whole command, on the project's shared 2-core CPU (load ~4.8)",
    "mini": "about 13 min (754 s, seed 42, docs/RESULTS.md issue 12) on the project's shared 2-core CPU, 1 thread",
    "paper": "not measured (the paper's 8-GPU setting)",
}


# ----------------------------------------------------------------------------------------------------- models
def _tiny_vocab() -> list[str]:
    """The WordPiece vocabulary of the tiny encoder: BERT's special tokens, every printable ASCII character (lower
    case) alone and as a ``##`` continuation, then the words of the built-in tiny pairs and of the prompts, so those
    texts tokenise into whole words and anything else into characters. Generated: nothing is downloaded."""
    import string

    from cde_st.prompts import CLASSIFICATION_PROMPT, CLUSTERING_PROMPT, DOCUMENT_PROMPT, QUERY_PROMPT

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = sorted(set(string.ascii_lowercase + string.digits + string.punctuation))
    texts = [text for row in _tiny_pairs() for text in (row["query"], row["document"])]
    texts += [QUERY_PROMPT, DOCUMENT_PROMPT, CLASSIFICATION_PROMPT, CLUSTERING_PROMPT]
    words = sorted({w for text in texts for w in re.findall(r"[a-z0-9]+", text.lower())} - set(chars))
    return specials + chars + ["##" + c for c in chars] + words


def build_tiny_tokenizer(path: str | os.PathLike):
    """A ``BertTokenizerFast`` (lower case) over :func:`_tiny_vocab`, with its ``vocab.txt`` written to ``path``."""
    from transformers import BertTokenizerFast

    os.makedirs(path, exist_ok=True)
    vocab_file = os.path.join(path, "vocab.txt")
    with open(vocab_file, "w", encoding="utf-8") as f:
        f.write("".join(token + "\n" for token in _tiny_vocab()))
    return BertTokenizerFast(vocab=vocab_file, do_lower_case=True)


def build_tiny_encoder(path: str | os.PathLike, hidden_size: int = 32, num_layers: int = 2, seed: int = 0) -> str:
    """Save a tiny randomly initialised BERT with its own generated WordPiece tokenizer to ``path`` (a Hugging Face
    model folder) and return ``path``: the base model of ``--preset tiny`` and of the tests, built offline without
    any downloaded model."""
    from transformers import BertConfig, BertModel

    from cde_st._files import write_folder_atomically

    path = str(path)
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(_tiny_vocab()),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden_size,
        max_position_embeddings=512,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    encoder = BertModel(config, add_pooling_layer=False)

    def write(staging):
        encoder.save_pretrained(staging)
        build_tiny_tokenizer(staging).save_pretrained(staging)

    # Several processes of one launch (torchrun) may build it at once: same seed, same files.
    write_folder_atomically(path, write)
    return path


def _model_path(name: str | None, cfg: TrainConfig) -> str | None:
    """The folder or hub id a config's model name stands for: "minilm" is the offline all-MiniLM-L6-v2, "tiny" the
    run's tiny random encoder (built once in ``output_dir/_tiny_base``); anything else is itself."""
    from cde_st._defaults import default_surrogate_model_path

    if name == "minilm":
        return default_surrogate_model_path()
    if name == "tiny":
        return build_tiny_encoder(os.path.join(cfg.output_dir, "_tiny_base"), seed=cfg.seed)
    return name


def _base_model_path(cfg: TrainConfig) -> str:
    return _model_path(cfg.base_model, cfg)


def resolved_prompts(cfg: TrainConfig) -> dict[str, str]:
    contextual = cfg.model == "contextual" or (cfg.model == "continue" and _is_cde_folder(cfg.init_from))
    query = cfg.query_prompt if cfg.query_prompt is not None else ("search_query: " if contextual else "")
    document = cfg.document_prompt if cfg.document_prompt is not None else ("search_document: " if contextual else "")
    return {"query": query, "document": document}


def _is_cde_folder(path: str | None) -> bool:
    return bool(path) and os.path.exists(os.path.join(path, "cde_config.json"))


def build_model(cfg: TrainConfig):
    """A new contextual model, a plain bi-encoder, or a saved model to continue from."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    from cde_st import ContextualSentenceTransformer

    prompts = resolved_prompts(cfg)
    if cfg.model == "continue":
        if not cfg.init_from or not os.path.exists(cfg.init_from):
            raise FileNotFoundError(f"model=continue needs an existing init_from folder, got {cfg.init_from!r}.")
        if _is_cde_folder(cfg.init_from):
            return ContextualSentenceTransformer(cfg.init_from)
        return SentenceTransformer(cfg.init_from)
    path = _base_model_path(cfg)
    if cfg.model == "contextual":
        return ContextualSentenceTransformer.from_encoder(
            path,
            context_size=cfg.context_size,
            max_seq_length=cfg.max_seq_length,
            query_prompt=prompts["query"],
            document_prompt=prompts["document"],
            **cfg.model_config,
        )
    if cfg.model == "biencoder":
        if os.path.exists(os.path.join(path, "modules.json")):
            model = SentenceTransformer(path)
        else:
            transformer = Transformer(path, max_seq_length=cfg.max_seq_length)
            model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")])
        model.max_seq_length = cfg.max_seq_length
        model.prompts = {**model.prompts, **prompts}
        return model
    raise ValueError(f"model must be 'contextual', 'biencoder' or 'continue', got {cfg.model!r}.")


# ------------------------------------------------------------------------------------------------------- data
def _tiny_pairs() -> list[dict[str, str]]:
    topics = ["rain", "stocks", "proteins", "glaciers", "courts", "coffee", "music", "networks"]
    rows = []
    for i in range(64):
        topic = topics[i % len(topics)]
        rows.append(
            {
                "query": f"question {i} about {topic}",
                "document": f"a passage number {i} explaining {topic} in some detail",
                "domain": "even" if i % 2 == 0 else "odd",
            }
        )
    return rows


def _jsonl_files(source: str) -> list[str]:
    if os.path.isdir(source):
        files = sorted(glob.glob(os.path.join(source, "*.jsonl")) + glob.glob(os.path.join(source, "*.jsonl.gz")))
        if not files:
            raise FileNotFoundError(f"No *.jsonl or *.jsonl.gz files in {source}.")
        return files
    if not os.path.exists(source):
        raise FileNotFoundError(f"Training data {source!r} does not exist.")
    return [source]


def _domain_of(path: str) -> str:
    name = os.path.basename(path)
    for suffix in (".gz", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return name


class TrainingDataError(ValueError):
    """A training data file that cannot be read as pairs; the message names the file and the line."""


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _read_jsonl_rows(path: str) -> list[dict[str, str]]:
    """The (query, document, domain) rows of a jsonl(.gz) file, each line checked: a JSON object with string
    ``query`` and ``document`` (and, if present, ``domain``; the file name otherwise). Blank lines are skipped,
    other fields ignored. A :class:`TrainingDataError` names the file and line of the first bad row."""
    default_domain = _domain_of(path)
    rows = []
    opener = gzip.open if path.endswith(".gz") else open
    line_no = 0
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"{path}, line {line_no}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise TrainingDataError(f"{where}: invalid JSON: {err.msg} (column {err.colno}).") from None
                if not isinstance(row, dict):
                    raise TrainingDataError(
                        f"{where}: expected a JSON object with query and document, got {type(row).__name__}."
                    )
                missing = [k for k in ("query", "document") if k not in row]
                if missing:
                    raise TrainingDataError(
                        f"{where}: missing field(s) {missing}; each row needs query and document (domain optional)."
                    )
                for key in ("query", "document", "domain"):
                    if key in row and not isinstance(row[key], str):
                        value = row[key]
                        raise TrainingDataError(
                            f"{where}: field {key!r} must be a string, got {type(value).__name__} {value!r:.80}."
                        )
                    if key in row and not _encodable(row[key]):
                        bad = next(c for c in row[key] if not _encodable(c))
                        raise TrainingDataError(
                            f"{where}: field {key!r} holds a lone surrogate escape \\u{ord(bad):04x} (half of a "
                            "UTF-16 pair), which is not text a tokenizer can read; fix or drop the row."
                        )
                rows.append(
                    {"query": row["query"], "document": row["document"], "domain": row.get("domain", default_domain)}
                )
    except (UnicodeDecodeError, OSError, EOFError) as err:  # not UTF-8, not gzip, truncated gzip
        raise TrainingDataError(f"{path}, line {line_no + 1}: cannot read the file: {err}.") from None
    if not rows:
        logger.warning("%s holds no pairs (empty file).", path)
    return rows


def _load_jsonl_pairs(path: str):
    from datasets import Dataset

    rows = _read_jsonl_rows(path)
    return Dataset.from_dict(
        {
            "query": [r["query"] for r in rows],
            "document": [r["document"] for r in rows],
            "domain": [r["domain"] for r in rows],
            "source": [_domain_of(path)] * len(rows),
        }
    )


def _load_beir_pairs(folder: str, split: str = "train"):
    """(query, positive document) pairs from a BEIR folder's qrels (score > 0)."""
    from datasets import Dataset

    from cde_st.evaluation.local_tasks import load_retrieval_split

    data = load_retrieval_split(folder, split)
    docs = {
        i: (t + " " + x).strip()
        for i, t, x in zip(data["corpus"]["id"], data["corpus"]["title"], data["corpus"]["text"])
    }
    queries = dict(zip(data["queries"]["id"], data["queries"]["text"]))
    rows = [
        (queries[q], docs[d])
        for q, rel in data["relevant_docs"].items()
        for d, score in rel.items()
        if score > 0 and q in queries and d in docs
    ]
    name = Path(folder).name + f"_{split}"
    return Dataset.from_dict(
        {"query": [r[0] for r in rows], "document": [r[1] for r in rows], "domain": [name] * len(rows)}
    )


def _load_hub_pairs(spec: str):
    from datasets import load_dataset

    name, _, config = spec.partition(":")
    ds = load_dataset(name, config or None, split="train")
    text_columns = [c for c, f in ds.features.items() if getattr(f, "dtype", None) == "string"]
    if len(text_columns) < 2:
        raise ValueError(f"Hub dataset {spec!r} has fewer than two text columns: {list(ds.features)}.")
    ds = ds.select_columns(text_columns[:2]).rename_columns({text_columns[0]: "query", text_columns[1]: "document"})
    return ds.add_column("domain", [name] * len(ds))


def load_pairs(cfg: TrainConfig):
    """All training pairs as one ``Dataset(query, document, domain)``: local jsonl(.gz) files or folders of them
    (the format of ../shared/data/pairs), ``beir:FOLDER[:split]`` (train qrels), ``hub:NAME[:config]``, or
    ``builtin:tiny``. ``exclude_domains`` drops rows by domain or by source file name (e.g. ``scifact`` or
    ``scifact_train``); per-domain prompts are applied to the texts."""
    from datasets import Dataset, concatenate_datasets

    parts = []
    for source in cfg.train_data:
        if source == "builtin:tiny":
            parts.append(Dataset.from_list(_tiny_pairs()))
        elif source.startswith("beir:"):
            folder, _, split = source[len("beir:") :].partition(":")
            parts.append(_load_beir_pairs(folder, split or "train"))
        elif source.startswith("hub:"):
            parts.append(_load_hub_pairs(source[len("hub:") :]))
        else:
            parts.extend(_load_jsonl_pairs(path) for path in _jsonl_files(source))
    if not parts:
        raise ValueError("No training data: set train_data.")
    parts = [p if "source" in p.column_names else p.add_column("source", list(p["domain"])) for p in parts]
    pairs = concatenate_datasets(parts)
    if cfg.exclude_domains:
        excluded = set(cfg.exclude_domains)
        pairs = pairs.filter(lambda d, s: d not in excluded and s not in excluded, input_columns=["domain", "source"])
    pairs = pairs.remove_columns("source")
    if len(pairs) == 0:
        raise ValueError(f"No training pairs left after excluding domains {cfg.exclude_domains}.")
    if cfg.max_pairs is not None and cfg.max_pairs < len(pairs):
        pairs = pairs.shuffle(seed=cfg.seed).select(range(cfg.max_pairs))
    if cfg.domain_prompts:

        def prefix(row):
            prompts = cfg.domain_prompts.get(row["domain"], {})
            return {
                "query": prompts.get("query", "") + row["query"],
                "document": prompts.get("document", "") + row["document"],
            }

        pairs = pairs.map(prefix)
    return pairs


# ------------------------------------------------------------------------------------------------- the run
def _bf16(cfg: TrainConfig) -> bool:
    if cfg.bf16 == "auto":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return bool(cfg.bf16)


def build_loss(cfg: TrainConfig, model):
    from cde_st._defaults import load_default_surrogate
    from cde_st.losses import FilteredInfoNCELoss

    guide = None
    if cfg.filter_false_negatives:
        if cfg.guide is None:
            guide = load_default_surrogate()
        else:
            from sentence_transformers import SentenceTransformer

            guide = SentenceTransformer(_model_path(cfg.guide, cfg))
    return FilteredInfoNCELoss(
        model,
        guide=guide,
        temperature=cfg.temperature,
        margin=cfg.margin,
        mini_batch_size=cfg.mini_batch_size,
        context_mini_batch_size=cfg.context_mini_batch_size,
        bidirectional=cfg.bidirectional,
        filter_false_negatives=cfg.filter_false_negatives,
        context_dropout=cfg.context_dropout,
        gather_across_devices=cfg.gather_across_devices,
        leave_one_out=cfg.leave_one_out,
    )


def build_optimizer(cfg: TrainConfig, model) -> torch.optim.Optimizer:
    """AdamW with the trainer's defaults, weight decay off for biases, norms and context gates, and the
    parameters cde_st adds to the pretrained encoders (context gates, heads, null vector, soft prompt) at
    ``added_params_lr``: they start at zero or at random, so they may want a larger step than the encoders."""
    added, no_decay = set(), set()
    if cfg.model != "biencoder":
        from cde_st.model import contextual_module, is_contextual

        if is_contextual(model):
            module = contextual_module(model)
            added = {id(p) for _, p in module.added_parameters()}
            if module.gates is not None:
                no_decay.add(id(module.gates))  # decay would pull the gates shut
    groups: dict[tuple[bool, bool], list] = {}
    for param in model.parameters():
        if param.requires_grad:
            decay = param.ndim >= 2 and id(param) not in no_decay
            groups.setdefault((id(param) in added, decay), []).append(param)
    return torch.optim.AdamW(
        [
            {
                "params": params,
                "lr": cfg.learning_rate if not is_added or cfg.added_params_lr is None else cfg.added_params_lr,
                "weight_decay": cfg.weight_decay if decay else 0.0,
            }
            for (is_added, decay), params in sorted(groups.items())
        ],
        lr=cfg.learning_rate,
    )


def build_batch_sampler(cfg: TrainConfig, pairs):
    from sentence_transformers.base.sampler import BatchSamplers

    if cfg.batching == "random":
        return BatchSamplers.NO_DUPLICATES
    if cfg.batching != "clustered":
        raise ValueError(f"batching must be 'clustered' or 'random', got {cfg.batching!r}.")
    from cde_st.batching import ClusteredBatchSampler

    return partial(
        ClusteredBatchSampler,
        cluster_size=min(cfg.batch_size if cfg.cluster_size is None else cfg.cluster_size, len(pairs)),
        model=_model_path(cfg.surrogate, cfg),
        surrogate_kind=cfg.surrogate_kind,
        domains=list(pairs["domain"]),  # a plain list: the trainer pickles these options into every checkpoint
        query_column="query",
        document_column="document",
        max_seq_length=cfg.max_seq_length,  # the surrogate sees what the model sees (and it is much faster)
    )


def build_evaluator(cfg: TrainConfig):
    """The in-training evaluator of ``cfg.eval_folder``: a :class:`~cde_st.evaluation.evaluators.ContextualRetrievalEvaluator`,
    which scores a contextual model with the model's J documents of the evaluated corpus as context (a stock
    ``InformationRetrievalEvaluator`` would score the null context, a plain bi-encoder)."""
    if not cfg.eval_folder:
        return None
    from cde_st.evaluation.evaluators import ContextualRetrievalEvaluator

    return ContextualRetrievalEvaluator(
        cfg.eval_folder,
        split=cfg.eval_split,
        max_corpus=cfg.eval_max_corpus,
        seed=cfg.seed,
        name=Path(cfg.eval_folder).name,
    )


# Fields a resumed run may change: they say how long to train and what to log/keep, not what is trained.
RESUMABLE_FIELDS = frozenset(
    {
        "max_steps",
        "num_train_epochs",
        "save_steps",
        "save_total_limit",
        "logging_steps",
        "eval_steps",
        "dataloader_num_workers",
        "output_dir",
    }
)
# What a run writes into its output folder (removed by ``overwrite_output_dir``; other files are left alone).
_RUN_OUTPUTS = ("checkpoint-*", "final", "train_summary.json", "train_config.json", "_tiny_base")


class OutputDirError(FileExistsError):
    """The output folder holds an earlier run, and neither resuming nor overwriting it was asked for."""


class ResumeConfigError(TrainConfigError):
    """A resumed run's config differs from the one its checkpoints were trained with."""


class RunFinishedError(RuntimeError):
    """A resumed run whose checkpoint already reached the configured length: there is nothing to train."""


def _refuse_to_resume_a_finished_run(cfg: TrainConfig, checkpoint: str) -> None:
    """A :class:`RunFinishedError` when ``checkpoint`` already trained as far as ``cfg`` asks (``max_steps``, or
    the epochs the run was planned with): resuming it would train past the end and replace ``final/``."""
    state_path = os.path.join(checkpoint, "trainer_state.json")
    if not os.path.exists(state_path):
        return
    with open(state_path, encoding="utf-8") as f:
        state = json.load(f)
    step, planned = state.get("global_step", 0), state.get("max_steps", 0)
    if cfg.max_steps > 0:
        finished, target = step >= cfg.max_steps, f"max_steps = {cfg.max_steps}"
    else:
        epochs = state.get("num_train_epochs", cfg.num_train_epochs)
        finished = planned > 0 and step >= planned and cfg.num_train_epochs <= epochs
        target = f"num_train_epochs = {cfg.num_train_epochs:g} ({planned} steps)"
    if finished:
        raise RunFinishedError(
            f"The run in {cfg.output_dir} is finished: {checkpoint} is at step {step}, and the config asks for "
            f"{target}. Nothing was changed. To train further, resume with a larger max_steps or num_train_epochs "
            "(--set max_steps=N)."
        )


def _checkpoints(folder: str) -> list[str]:
    found = glob.glob(os.path.join(glob.escape(folder), "checkpoint-*"))
    return sorted((os.path.basename(p) for p in found if os.path.isdir(p)), key=lambda n: (len(n), n))


def _changed_fields(previous: dict[str, Any], cfg: TrainConfig) -> list[str]:
    """``field: old -> new`` for each field of ``cfg`` that differs from a saved ``train_config.json``."""
    current = json.loads(json.dumps(cfg.to_dict()))  # tuples -> lists, as stored
    defaults = json.loads(json.dumps(TrainConfig().to_dict()))
    changed = []
    for key, value in current.items():
        if key in RESUMABLE_FIELDS:
            continue
        old = previous.get(key, defaults[key])  # a field added since the run started had its default
        if old != value:
            changed.append(f"{key}: {old!r} -> {value!r}")
    return changed


def _input_paths(cfg: TrainConfig) -> dict[str, str]:
    """Every local path the run reads, by the config field that names it."""
    named = {"init_from": cfg.init_from, "base_model": cfg.base_model, "surrogate": cfg.surrogate, "guide": cfg.guide}
    named["eval_folder"] = cfg.eval_folder
    for i, source in enumerate(cfg.train_data):
        if source.startswith("beir:"):
            source = source[len("beir:") :].partition(":")[0]
        named[f"train_data[{i}]"] = source
    return {key: path for key, path in named.items() if path and os.path.exists(path)}


def _refuse_to_remove_inputs(cfg: TrainConfig, doomed: list[str]) -> None:
    """An :class:`OutputDirError` when overwriting the output folder would remove one of the run's inputs (e.g.
    ``init_from: OUT/final`` with ``overwrite_output_dir``): the run would delete what it is about to read."""
    for key, path in _input_paths(cfg).items():
        real = os.path.realpath(path)
        for victim in doomed:
            gone = os.path.realpath(victim)
            if real == gone or real.startswith(gone.rstrip(os.sep) + os.sep):
                raise OutputDirError(
                    f"overwrite_output_dir (--overwrite-output-dir) would remove {victim}, which holds the run's input "
                    f"{key}: {path}. Nothing was removed. Copy that input elsewhere first, or train into a new "
                    "output_dir (--output-dir)."
                )


def prepare_output_dir(
    cfg: TrainConfig,
    resume: bool | str = False,
    overwrite_output_dir: bool = False,
    allow_config_change: bool = False,
) -> None:
    """Make ``cfg.output_dir`` ready for a run and write its ``train_config.json``.

    An output folder that already holds a run (checkpoints, a final model or a summary) is refused unless the run
    is resumed or ``overwrite_output_dir`` removes that run's outputs first. A resumed run must have the config its
    checkpoints were trained with, except :data:`RESUMABLE_FIELDS` (how long to train, what to log and keep) or
    with ``allow_config_change``; otherwise a :class:`ResumeConfigError` lists the changed fields.
    """
    out = cfg.output_dir
    if resume and overwrite_output_dir:
        raise ValueError("Choose one of resume (--resume) and overwrite_output_dir (--overwrite-output-dir).")
    config_path = os.path.join(out, "train_config.json")
    if resume:
        checkpoint_dir = resume if isinstance(resume, str) else None
        if checkpoint_dir is None and not _checkpoints(out):
            raise FileNotFoundError(f"Cannot resume: {out} holds no checkpoint-* folder (nothing was saved there yet).")
        if checkpoint_dir is not None and not os.path.isdir(checkpoint_dir):
            raise FileNotFoundError(f"Cannot resume: checkpoint folder {checkpoint_dir} does not exist.")
        candidates = [config_path]
        if checkpoint_dir is not None:
            candidates.append(os.path.join(os.path.dirname(os.path.abspath(checkpoint_dir)), "train_config.json"))
        previous_path = next((p for p in candidates if os.path.exists(p)), None)
        if previous_path is not None and not allow_config_change:
            with open(previous_path, encoding="utf-8") as f:
                changed = _changed_fields(json.load(f), cfg)
            if changed:
                raise ResumeConfigError(
                    f"Cannot resume with a changed config: the run's checkpoints were trained with {previous_path}, "
                    f"which differs in {len(changed)} field(s):\n  " + "\n  ".join(changed) + "\n"
                    "Resume with the same config, train into a new --output-dir, or pass allow_config_change=True "
                    "(--allow-config-change) to resume with these changes anyway."
                )
        _refuse_to_resume_a_finished_run(cfg, checkpoint_dir or os.path.join(out, _checkpoints(out)[-1]))
    else:
        earlier = _checkpoints(out) if os.path.isdir(out) else []
        earlier += [n for n in ("final", "train_summary.json") if os.path.exists(os.path.join(out, n))]
        if earlier and not overwrite_output_dir:
            raise OutputDirError(
                f"Output folder {out} already holds a training run ({', '.join(earlier)}). Pass resume=True "
                "(--resume) to continue it, overwrite_output_dir=True (--overwrite-output-dir) to replace it, or "
                "choose a new output_dir (--output-dir)."
            )
        if overwrite_output_dir and os.path.isdir(out):
            doomed = [p for pattern in _RUN_OUTPUTS for p in glob.glob(os.path.join(glob.escape(out), pattern))]
            _refuse_to_remove_inputs(cfg, doomed)
            for path in doomed:
                logger.warning("overwrite_output_dir: removing %s", path)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    os.makedirs(out, exist_ok=True)
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(cfg.to_dict(), f, indent=2)


def _trainer_class():
    """SentenceTransformerTrainer whose checkpoints only the main process writes. transformers moved that guard into
    ``Trainer._save``, which sentence-transformers 6.2 overrides without it: under torchrun every rank wrote the
    same checkpoint files at once."""
    from sentence_transformers import SentenceTransformerTrainer

    class _MainProcessSavingTrainer(SentenceTransformerTrainer):
        def _save(self, output_dir: str | None = None, state_dict=None) -> None:
            if self.args.should_save:
                super()._save(output_dir, state_dict=state_dict)

    return _MainProcessSavingTrainer


def train(
    cfg: TrainConfig,
    resume: bool | str = False,
    overwrite_output_dir: bool = False,
    allow_config_change: bool = False,
    evaluator=None,
):
    """Train as configured; save the final model (with its model card) to ``output_dir/final``; return it.

    ``resume``: continue from the last checkpoint in ``output_dir`` (or from the given checkpoint folder);
    ``overwrite_output_dir``: replace an earlier run in ``output_dir``; ``allow_config_change``: resume although
    the config differs from the checkpoints' (see :func:`prepare_output_dir`). ``evaluator``: a
    sentence-transformers evaluator to use instead of ``eval_folder``'s; for a contextual model it goes through
    :func:`cde_st.evaluation.evaluators.with_corpus_context` (a stock ``InformationRetrievalEvaluator`` gets its own corpus as
    context, other evaluators must come wrapped in :class:`~cde_st.evaluation.evaluators.ContextualEvaluator`)."""
    from sentence_transformers import SentenceTransformerTrainingArguments

    from cde_st.evaluation.evaluators import with_corpus_context

    if evaluator is not None and cfg.eval_folder:
        raise ValueError(
            f"Give either eval_folder ({cfg.eval_folder!r}) or an evaluator ({type(evaluator).__name__}), not both."
        )
    torch.manual_seed(cfg.seed)
    # Under torchrun / accelerate launch every rank runs this function; only rank 0 touches the output folder.
    is_main = int(os.environ.get("RANK", "0")) == 0
    if is_main:
        prepare_output_dir(cfg, resume, overwrite_output_dir, allow_config_change)
    elif resume and (isinstance(resume, str) or _checkpoints(cfg.output_dir)):
        # The other ranks stop with rank 0 on a finished run instead of waiting for it in the first collective.
        checkpoint = resume if isinstance(resume, str) else os.path.join(cfg.output_dir, _checkpoints(cfg.output_dir)[-1])
        _refuse_to_resume_a_finished_run(cfg, checkpoint)

    pairs = load_pairs(cfg)
    train_dataset = pairs.remove_columns("domain")  # the collator would feed any extra column to the model
    model = build_model(cfg)
    loss = build_loss(cfg, model)
    # A contextual model must never be scored (and its best checkpoint chosen) with the null context.
    evaluator = with_corpus_context(evaluator or build_evaluator(cfg), model, seed=cfg.seed)
    prompts = resolved_prompts(cfg)
    args = SentenceTransformerTrainingArguments(
        output_dir=cfg.output_dir,
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate,
        warmup_steps=cfg.warmup_steps,
        lr_scheduler_type="linear",
        num_train_epochs=cfg.num_train_epochs,
        max_steps=cfg.max_steps,
        weight_decay=cfg.weight_decay,
        bf16=_bf16(cfg),
        seed=cfg.seed,
        batch_sampler=build_batch_sampler(cfg, pairs),
        prompts={"query": prompts["query"], "document": prompts["document"]} if any(prompts.values()) else None,
        eval_strategy="steps" if (evaluator is not None and cfg.eval_steps) else "no",
        eval_steps=cfg.eval_steps,
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        logging_steps=cfg.logging_steps,
        dataloader_num_workers=cfg.dataloader_num_workers,
        dataloader_drop_last=False,
        dataloader_pin_memory=torch.cuda.is_available(),
        # Without CUDA, a launcher's processes must be told they train on the CPU (accelerate then runs them
        # data-parallel over gloo); otherwise the process group stays idle and every process trains alone.
        use_cpu=not torch.cuda.is_available(),
        report_to="none",
    )
    if args.world_size > 1:
        logger.info(
            "data-parallel training on %d processes (%s): %d pairs per rank and step, %d in all",
            args.world_size,
            args.parallel_mode.value,
            cfg.batch_size,
            cfg.batch_size * args.world_size,
        )
    trainer = _trainer_class()(
        model=model,
        args=args,
        train_dataset=train_dataset,
        loss=loss,
        evaluator=evaluator,
        optimizers=(build_optimizer(cfg, model), None),  # the trainer adds its linear warm-up schedule
    )
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume or None)
    wall = time.perf_counter() - start
    if not trainer.is_world_process_zero():
        return model
    final_dir = os.path.join(cfg.output_dir, "final")
    model.save(final_dir)
    summary = {
        "train_wall_seconds": round(wall, 1),
        "steps": trainer.state.global_step,
        "pairs": len(pairs),
        "processes": args.world_size,
    }
    if evaluator is not None:
        summary["final_eval"] = evaluator(model)
    with open(os.path.join(cfg.output_dir, "train_summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    logger.info("training done: %s", summary)
    return model
