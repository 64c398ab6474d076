"""The training config: :class:`TrainConfig` (every knob of a run), its checks, config files and presets.

A config comes from a preset (``cde_st/training/presets/NAME.yaml``, commented files to read and copy), a YAML or
JSON file (``--config``; a ``preset:`` key starts from that preset), ``--set KEY=VALUE`` overrides, or Python
(``TrainConfig(...)``, :meth:`TrainConfig.from_preset`). Every route checks the values the same way: known field
names, the declared types (:func:`cde_st.coercion.coerce`), the allowed choices and ranges; errors name
the source (file and line where there is one), the field, the value and what it must be.

    cfg = TrainConfig.from_preset("mini", train_data=["path/to/pairs"], output_dir="runs/mini-cde")
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from cde_st.batching.surrogate import SurrogateKind
from cde_st.coercion import ConfigValueError, coerce, load_config_text, load_yaml_value
from cde_st.context import SEED_RULE, is_seed
from cde_st.modules.contextual_config import ContextualConfig


class TrainConfigError(ValueError):
    """A training config field with an unknown name, a value of the wrong type, or an unsupported choice."""


# The choice fields (checked by the coercion rule, whose error names the field and lists the allowed values).
ModelKind = Literal["contextual", "biencoder", "continue"]
BatchingKind = Literal["clustered", "random"]


def _positive_or_none(value: Any) -> bool:
    return value is None or value >= 1


# What each numeric field accepts beyond its type (a value outside would be silently misread or break late):
# field -> (accepts(value), what it must be).
_RANGES: dict[str, tuple[Any, str]] = {
    "seed": (is_seed, f"{SEED_RULE} (numpy, torch and faiss seeds are unsigned)"),
    "context_size": (lambda v: v >= 0, "must be >= 0 (0: no context slots)"),
    "max_seq_length": (lambda v: v >= 1, "must be >= 1"),
    "max_pairs": (_positive_or_none, "must be >= 1, or null for all pairs"),
    "cluster_size": (_positive_or_none, "must be >= 1, or null for the batch size (the paper's choice)"),
    # InfoNCE tells a query's document apart from the batch's other documents: with one pair per batch its document
    # is the only candidate, the loss is 0 at every step and nothing is learned.
    "batch_size": (
        lambda v: v >= 2,
        "must be >= 2: with batch_size = 1 a query's document is the only candidate, so the loss is 0 and nothing "
        "is learned",
    ),
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
    """``model_config`` checked against the fields of :class:`~cde_st.modules.ContextualConfig` (the architecture of
    the contextual module, :class:`~cde_st.modules.ContextualTransformer`) and coerced to their types: known
    names, the right types (a string ``"false"`` is not a boolean, 2.5 is not an int), and no option that has a
    TrainConfig field of its own. A ``TypeError`` says what is wrong."""
    own = {"context_size": "context_size", "max_seq_length": "max_seq_length"}
    own.update(query_prompt="query_prompt", document_prompt="document_prompt")
    hints = typing.get_type_hints(ContextualConfig)
    allowed = [f.name for f in dataclasses.fields(ContextualConfig) if f.name not in own]
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
        checked[key] = coerce(value, hints[key], f"model_config.{key}")
    return checked


@dataclass
class TrainConfig:
    """Every knob of a training run. Defaults are the paper's where the paper has one."""

    # ---- model
    model: ModelKind = "contextual"  # "contextual", "biencoder", or "continue" (from init_from)
    base_model: str = "minilm"  # HF id / folder / sentence-transformers folder; "minilm" (offline), "tiny" (random)
    init_from: str | None = None  # a saved cde_st or sentence-transformers model to continue from
    context_size: int = 512
    max_seq_length: int = 512
    model_config: dict[str, Any] = field(default_factory=dict)  # extra ContextualTransformer fields
    query_prompt: str | None = None  # None: "search_query: " for contextual models, "" for bi-encoders
    document_prompt: str | None = None  # None: "search_document: " for contextual models, "" for bi-encoders
    # ---- data
    # Folders or .jsonl(.gz) files of query/document pairs, beir:FOLDER[:split], hub:NAME[:config] or builtin:tiny.
    # No default: a run names its data (see TRAIN_DATA_HELP); only the tiny preset brings its own.
    train_data: list[str] = field(default_factory=list)
    exclude_domains: list[str] = field(default_factory=list)
    max_pairs: int | None = None
    domain_prompts: dict[str, dict[str, str]] = field(default_factory=dict)  # {domain: {"query":..,"document":..}}
    # ---- batching
    batching: BatchingKind = "clustered"  # "clustered" (contextual batches) or "random"
    cluster_size: int | None = None  # None: the batch size (paper)
    surrogate: str | None = None  # clustering model; None: offline all-MiniLM-L6-v2; "tiny": the tiny base encoder
    # "transformer": `surrogate` embeds every pair. "static": a static model distilled from `surrogate` (model2vec,
    # once, cached) and fitted to it on 4,096 pairs embeds them: minutes instead of hours for 1M pairs on a CPU,
    # slightly easier batches (benchmarks/speed/RESULTS_sampler.md); needs pip install 'cde_st[fast-surrogate]'.
    surrogate_kind: SurrogateKind = "transformer"
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
    bf16: bool | Literal["auto"] = "auto"  # "auto": on for CUDA devices that support it
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
            what = (
                "a bi-encoder has no context options"
                if self.model == "biencoder"
                else ("a continued model keeps the options it was saved with")
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
                value = coerce(value, hints[key], key)
                if key == "model_config":
                    value = _checked_model_config(value)
            except TypeError as err:
                raise TrainConfigError(f"{at(key)}: {err}.") from None
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
        if (
            overrides.get("model", values.get("model", "contextual")) != "contextual"
            and "model_config" not in overrides
        ):
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
            values = load_config_text(text, str(path))
        except ConfigValueError as err:  # a key given twice
            raise TrainConfigError(str(err)) from None
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
        for key in INFORMATIONAL_KEYS:
            values.pop(key, None)
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


def parse_set_items(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items (the command line's overrides) as TrainConfig fields: values read as YAML, then
    checked and coerced against the field types (a :class:`TrainConfigError` names the item, the field and the
    expected type)."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise TrainConfigError(f"--set expects KEY=VALUE, got {item!r}.")
        try:
            parsed = load_yaml_value(value)  # the config files' rule: only true/false are booleans
        except yaml.YAMLError as err:
            raise TrainConfigError(f"--set {item}: cannot read the value: {err}") from None
        if not value.strip():
            parsed = ""  # `--set document_prompt=` is the empty prompt, not null (the default); write null for None
        elif parsed is not None and not isinstance(parsed, str) and _takes_text(key.strip()):
            parsed = value  # `--set query_prompt=search_query: ` is text, not the YAML mapping {search_query: None}
        overrides.update(TrainConfig.check_values({key.strip(): parsed}, f"--set {item}"))
    return overrides


def _takes_text(name: str) -> bool:
    """Whether TrainConfig field ``name`` holds one string (``str`` or ``str | None``)."""
    hint = typing.get_type_hints(TrainConfig).get(name)
    return hint is str or (typing.get_origin(hint) is not None and set(typing.get_args(hint)) == {str, type(None)})


def default_output_dir(preset: str | None, model: str, seed: int) -> str:
    """The output folder of a run that names none: ``runs/PRESET-MODEL-sSEED`` (``runs/MODEL-sSEED`` without a
    preset), so that runs of different presets, model kinds or seeds never write into the same folder."""
    return f"runs/{preset + '-' if preset else ''}{model}-s{seed}"


def _key_lines(text: str) -> dict[str, int]:
    """1-based line of each top-level key of a YAML/JSON mapping (empty when the text does not compose)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {key.value: key.start_mark.line + 1 for key, _ in node.value if isinstance(key, yaml.ScalarNode)}


# ---------------------------------------------------------------------------------------------------- presets
PRESET_DIR = Path(__file__).with_name("presets")
# Keys a config file may carry that describe it rather than set a field (a copied preset keeps its own).
INFORMATIONAL_KEYS = ("wall_time",)


def _read_presets(folder: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The presets shipped as ``folder/NAME.yaml``: their fields (checked when used, by
    :meth:`TrainConfig.from_preset`) and the measured train wall time each one states (``wall_time:``)."""
    presets, times = {}, {}
    for path in sorted(folder.glob("*.yaml")):
        values = load_config_text(path.read_text(encoding="utf-8"), str(path)) or {}
        times[path.stem] = str(values.pop("wall_time", "not measured"))
        presets[path.stem] = values
    return presets, times


# PRESETS: preset name -> its fields, from cde_st/training/presets/*.yaml. PRESET_TIMES: one measured train wall time
# per preset, with the machine it was measured on (what `cde-st-train --help` shows).
PRESETS, PRESET_TIMES = _read_presets(PRESET_DIR)


def config_yaml(cfg: TrainConfig) -> str:
    """``cfg`` as a YAML config file (every field, resolved), to copy and pass back with ``--config``."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False, allow_unicode=True, width=120)
