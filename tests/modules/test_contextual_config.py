"""ContextualConfig: defaults, every rule in one place, and cde_config.json as any cde_st version wrote it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from transformers import AutoModel

from cde_st import ContextualConfig, ContextualSentenceTransformer
from cde_st.modules.contextual_config import legacy_prompts, read_config_file

OLD_FOLDERS = Path(__file__).resolve().parents[1] / "fixtures" / "saved_a3f86a0"


def test_round_trip_through_a_dict():
    config = ContextualConfig(context_size=64, context_attention="cached", context_gate=True, context_layers=[1])
    assert ContextualConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert ContextualConfig.from_dict({}) == ContextualConfig()


@pytest.mark.parametrize("name", ["joint", "cached"])
def test_reads_cde_config_written_by_older_code(name):
    """A cde_config.json of commit a3f86a0: settings, encoder configs, context_info and the prompts it still held."""
    saved = read_config_file(str(OLD_FOLDERS / name / "cde_config.json"))
    config = ContextualConfig.from_dict(saved)
    assert config.context_size == 4 and config.max_seq_length == 48
    assert config.context_attention == saved["context_attention"]
    assert legacy_prompts(saved) == {"query_prompt": "search_query: ", "document_prompt": "search_document: "}


def test_unknown_field_is_named():
    with pytest.raises(ValueError, match="context_sise"):
        ContextualConfig.from_dict({"context_sise": 4})


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"context_attention": "both"}, "context_attention must be one of"),
        ({"context_size": -1}, "context_size must be >= 0"),
        ({"sequence_dropout": 1.0}, r"sequence_dropout must be in \[0, 1\)"),
        ({"max_seq_length": 0}, "max_seq_length must be a positive integer"),
        ({"context_max_seq_length": 2.5}, "context_max_seq_length must be a positive integer"),
        ({"context_layers": [1]}, "context_layers needs"),
        ({"context_layers": "top", "context_gate": True}, "context_layers must be a list"),
        ({"context_attention": "cached", "embed_joint_sequence": True}, "do not combine"),
        ({"context_gate": True, "prefix_positions": "sequence"}, "do not combine"),
        ({"context_attention": "cached", "context_sink": True}, "context_sink needs context_gate=True"),
    ],
)
def test_rules_are_checked_on_construction(fields, match):
    with pytest.raises(ValueError, match=match):
        ContextualConfig(**fields)
    with pytest.raises(ValueError, match=match):  # and on every change
        dataclasses.replace(ContextualConfig(), **fields)


def test_rules_that_need_the_encoders(tiny_bert_dir):
    encoder = AutoModel.from_pretrained(tiny_bert_dir)  # BERT: 2 layers, 512 positions
    resolved = ContextualConfig(context_gate=True, context_layers=[-1, 0], max_seq_length=64).for_encoders(
        encoder, encoder
    )
    assert resolved.context_layers == [0, 1] and resolved.context_max_seq_length == 64
    with pytest.raises(ValueError, match="context_layers must name at least one"):
        ContextualConfig(context_gate=True, context_layers=[2]).for_encoders(encoder, encoder)
    with pytest.raises(ValueError, match="needs a rotary backbone"):
        ContextualConfig(prefix_positions="sequence").for_encoders(encoder, encoder)
    with pytest.raises(ValueError, match=r"max_seq_length=513.*max_position_embeddings=512"):
        ContextualConfig(max_seq_length=513).for_encoders(encoder, encoder)


def test_module_takes_a_config_and_fields_over_it(make_tiny_cde):
    module = make_tiny_cde(context_size=4)[0]
    rebuilt = type(module)(module.first_stage, module.second_stage, module.tokenizer, module.config, context_size=6)
    assert rebuilt.config == dataclasses.replace(module.config, context_size=6)
    assert rebuilt.context_size == 6 and rebuilt.output_head == module.output_head


def test_prompts_live_in_model_prompts_only(make_tiny_cde, tmp_path):
    """cde_config.json no longer writes prompts; a folder whose cde_config.json has them (older cde_st) and whose
    sentence-transformers config has none gets them in model.prompts."""
    model = make_tiny_cde(context_size=4, prompts={"query": "q: ", "document": "passage: "})
    model.save(str(tmp_path / "m"))
    cde_config = json.loads((tmp_path / "m" / "cde_config.json").read_text(encoding="utf-8"))
    assert not {"query_prompt", "document_prompt"} & set(cde_config)
    assert ContextualSentenceTransformer(str(tmp_path / "m")).prompts == {"query": "q: ", "document": "passage: "}

    cde_config.update(query_prompt="old q: ", document_prompt="old d: ")
    (tmp_path / "m" / "cde_config.json").write_text(json.dumps(cde_config), encoding="utf-8")
    st_config_path = tmp_path / "m" / "config_sentence_transformers.json"
    st_config = json.loads(st_config_path.read_text(encoding="utf-8"))
    st_config.pop("prompts")
    st_config["default_prompt_name"] = None
    st_config_path.write_text(json.dumps(st_config), encoding="utf-8")
    loaded = ContextualSentenceTransformer(str(tmp_path / "m"))
    assert loaded.prompts == {"query": "old q: ", "document": "old d: "}
    assert loaded.default_prompt_name == "document"
    assert loaded.set_context(["a b c"]).prompt == "old d: "


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"include_prompt": "false"}, r"'include_prompt' = 'false' \(str\): expected bool"),
        ({"context_gate": "no"}, r"'context_gate' = 'no' \(str\): expected bool"),
        ({"first_stage_residual": "false"}, r"'first_stage_residual' = 'false' \(str\): expected bool"),
        ({"embed_joint_sequence": 1}, r"'embed_joint_sequence' = 1 \(int\): expected bool"),
        ({"context_size": 8.7}, r"'context_size' = 8\.7 \(float\): expected int"),
        ({"context_size": "eight"}, r"'context_size' = 'eight' \(str\): expected int"),
        ({"soft_prompt_tokens": None}, r"'soft_prompt_tokens' = None .*expected int"),
        ({"sequence_dropout": "a lot"}, r"'sequence_dropout' = 'a lot' \(str\): expected float"),
        ({"sequence_dropout": float("nan")}, r"sequence_dropout must be in \[0, 1\)"),
        ({"first_stage_head": 3}, r"'first_stage_head' = 3 \(int\): expected str"),
        ({"pool_skip_instruction": False}, r"'pool_skip_instruction' = False \(bool\): expected str or null"),
        ({"context_layers": [1.5], "context_gate": True}, r"'context_layers\[0\]' = 1\.5"),
    ],
)
def test_one_coercion_rule_for_every_route_naming_the_field(fields, match):
    """The training config's rule (cde_st.coercion): a bool is a real bool, an int a whole number."""
    with pytest.raises(ValueError, match=match):
        ContextualConfig(**fields)
    with pytest.raises(ValueError, match=match):  # the same error on every route
        dataclasses.replace(ContextualConfig(), **fields)
    with pytest.raises(ValueError, match=match):
        ContextualConfig.from_dict(json.loads(json.dumps(fields, allow_nan=True)))


def test_whole_numbers_are_coerced_and_kept_as_ints():
    config = ContextualConfig(context_size=8.0, max_seq_length=64.0, sequence_dropout=0)
    assert (config.context_size, config.max_seq_length, config.sequence_dropout) == (8, 64, 0.0)
    assert type(config.context_size) is int and type(config.sequence_dropout) is float
    assert config == ContextualConfig(context_size=8, max_seq_length=64, sequence_dropout=0.0)


def test_a_bad_field_in_cde_config_json_is_named_with_the_file(make_tiny_cde, tmp_path):
    model = make_tiny_cde(context_size=4)
    model.save(str(tmp_path / "m"))
    path = tmp_path / "m" / "cde_config.json"
    saved = json.loads(path.read_text(encoding="utf-8"))
    saved["include_prompt"] = "false"
    path.write_text(json.dumps(saved), encoding="utf-8")
    with pytest.raises(ValueError, match=r"cde_config\.json.*'include_prompt' = 'false' \(str\): expected bool"):
        ContextualSentenceTransformer(str(tmp_path / "m"))
