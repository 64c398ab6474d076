"""cde_st.training.config: presets, config files, --set values and direct construction, all checked the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

from cde_st.cli import train_main
from cde_st.training import TrainConfig


def test_presets_and_config_files(tmp_path):
    cfg = TrainConfig.from_preset("mini", batch_size=32)
    assert (cfg.context_size, cfg.max_seq_length, cfg.batch_size) == (64, 64, 32)
    assert "scifact_train" in cfg.exclude_domains
    path = tmp_path / "cfg.yaml"
    path.write_text("preset: tiny\nmodel: biencoder\nbatching: random\n")
    cfg = TrainConfig.from_file(path, max_steps=2)
    assert (cfg.model, cfg.batching, cfg.max_steps, cfg.base_model) == ("biencoder", "random", 2, "tiny")
    with pytest.raises(ValueError, match="unknown training config field 'batchsize'. Did you mean 'batch_size'"):
        TrainConfig.from_dict({"batchsize": 3})
    with pytest.raises(ValueError, match="Unknown preset"):
        TrainConfig.from_preset("huge")
    with pytest.raises(FileNotFoundError):
        TrainConfig.from_file(tmp_path / "missing.yaml")


def test_shipped_config_files_load():
    folder = Path(__file__).parents[2] / "train" / "configs"
    configs = {path.name: TrainConfig.from_file(path) for path in sorted(folder.glob("*.yaml"))}
    assert {"mini_contextual.yaml", "mini_contextual_j512.yaml"} <= set(configs)
    big, mini = configs["mini_contextual_j512.yaml"], TrainConfig.from_preset("mini")
    assert (big.context_size, big.batch_size, big.cluster_size, big.max_pairs) == (512, 512, 512, None)
    assert big.model_config == mini.model_config and big.context_dropout == mini.context_dropout


def test_set_overrides_are_coerced_to_the_field_types(cli_config, tmp_path):
    cfg = cli_config(
        ["--preset", "tiny", "--output-dir", str(tmp_path / "o"), "--set", "learning_rate=1e-3", "train_data=a.jsonl"],
    )
    assert cfg.learning_rate == 1e-3 and isinstance(cfg.learning_rate, float)  # YAML reads "1e-3" as a string
    assert cfg.train_data == ["a.jsonl"]  # a single path, not its characters
    cfg = cli_config(["--preset", "tiny", "--set", "max_steps=6.0", "added_params_lr=3", "guide=null"])
    assert (cfg.max_steps, cfg.added_params_lr, cfg.guide) == (6, 3.0, None)
    assert isinstance(cfg.max_steps, int) and isinstance(cfg.added_params_lr, float)


@pytest.mark.parametrize(
    "item, expected",
    [
        ("max_steps=2.5", r"max_steps.*2\.5.*int"),
        ("learning_rate=fast", r"learning_rate.*'fast'.*float"),
        ("filter_false_negatives=maybe", r"filter_false_negatives.*'maybe'.*bool"),
        ("train_data=[a, 3]", r"train_data\[1\].*3.*str"),
        ("domain_prompts=x", r"domain_prompts.*'x'.*dict"),
        ("batching=kmeans", r"batching.*'kmeans'.*clustered"),
        ("surrogate_kind=fast", r"surrogate_kind.*'fast'.*static"),
        ("batchsize=3", r"[Uu]nknown.*batchsize"),
    ],
)
def test_set_overrides_with_wrong_types_name_field_value_and_type(cli_config, capsys, item, expected):
    import re

    with pytest.raises(SystemExit) as exc:
        cli_config(["--preset", "tiny", "--set", item])
    message = capsys.readouterr().err + str(exc.value.code)
    assert "--set" in message and re.search(expected, message), message


def test_config_file_fields_are_checked_with_file_and_line(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("preset: tiny\nlearning_rate: 1e-3\ntrain_data: data/pairs.jsonl\n")
    cfg = TrainConfig.from_file(path)
    assert cfg.learning_rate == 1e-3 and cfg.train_data == ["data/pairs.jsonl"]
    path.write_text("preset: tiny\nmodel: biencoder\nmax_steps: 2.5\n")
    with pytest.raises(ValueError, match=rf"{path}, line 3: .*max_steps.*2\.5.*int"):
        TrainConfig.from_file(path)
    path = tmp_path / "run.json"
    path.write_text('{\n  "batch_size": 8,\n  "warmup_steps": "many"\n}\n')
    with pytest.raises(ValueError, match=rf"{path}, line 3: .*warmup_steps.*'many'.*int"):
        TrainConfig.from_file(path)
    path.write_text('{\n  "batch_size": 8,\n  "batchsize": 8\n}\n')
    with pytest.raises(ValueError, match=rf"{path}, line 3: .*[Uu]nknown.*batchsize"):
        TrainConfig.from_file(path)
    path.write_text('{\n  "batch_size": 8,\n')
    with pytest.raises(ValueError, match=rf"{path}.*line 3"):
        TrainConfig.from_file(path)


def test_presets_and_direct_construction_are_checked_too(monkeypatch):
    import cde_st.training

    monkeypatch.setitem(cde_st.training.PRESETS, "broken", {"max_steps": "ten"})
    with pytest.raises(ValueError, match=r"preset 'broken'.*max_steps.*'ten'.*int"):
        TrainConfig.from_preset("broken")
    with pytest.raises(ValueError, match=r"overrides.*batch_size.*1\.5.*int"):
        TrainConfig.from_preset("tiny", batch_size=1.5)
    assert TrainConfig(learning_rate="2e-5", exclude_domains="scifact").exclude_domains == ["scifact"]
    with pytest.raises(ValueError, match=r"TrainConfig.*context_size.*True.*int"):
        TrainConfig(context_size=True)


@pytest.mark.parametrize(
    "values, expected",
    [
        (dict(seed=-1), r"'seed' = -1: must be an integer in \[0, 2\*\*32\)"),
        (dict(cluster_size=0), r"'cluster_size' = 0: must be >= 1, or null for the batch size"),
        (dict(eval_steps=0), r"'eval_steps' = 0: must be >= 1, or null to evaluate only at the end"),
        (dict(max_pairs=0), r"'max_pairs' = 0: must be >= 1, or null for all pairs"),
        (dict(margin=10), r"'margin' = 10.0: .*a margin >= 2 filters every negative"),
        (dict(margin=float("nan")), r"'margin' = nan: must be a finite number"),
        (dict(added_params_lr=-1e-3), r"'added_params_lr' = -0.001: must be a finite number >= 0"),
        (dict(model_config={"context_gate": "false"}), r"model_config.context_gate' = 'false' \(str\): expected bool"),
        (dict(model_config={"soft_prompt_tokens": 2.5}), r"model_config.soft_prompt_tokens' = 2.5 .*expected int"),
        (dict(model_config={"context_size": 4.5}), r"model_config.context_size: context_size is a TrainConfig field"),
        (
            dict(model_config={"context_gates": True}),
            r"unknown ContextualTransformer option 'context_gates'.*context_gate",
        ),
        (dict(context_size=4.5), r"'context_size' = 4.5 \(float\): expected int"),
        (
            dict(model="biencoder", model_config={"context_gate": True}),
            r"model_config .* only applies to model: contextual",
        ),
    ],
)
def test_zero_none_and_out_of_range_fields_are_errors_that_name_the_field(values, expected):
    from cde_st.training import TrainConfigError

    with pytest.raises(TrainConfigError, match=expected):
        TrainConfig(**values)


def test_the_mini_preset_writes_out_the_recipe_a_new_model_starts_with():
    from cde_st.modules.source_pipeline import STARTS_AS_SOURCE, starts_as_source_layers

    minilm_layers = 6  # the mini preset's base model, all-MiniLM-L6-v2
    expected = {**STARTS_AS_SOURCE, "context_layers": starts_as_source_layers(minilm_layers)}
    assert TrainConfig.from_preset("mini").model_config == expected


def test_preset_model_config_is_dropped_for_a_biencoder_and_kept_for_a_contextual_model():
    assert TrainConfig.from_preset("mini", model="biencoder").model_config == {}
    assert TrainConfig.from_preset("mini").model_config["context_gate"] is True
    assert TrainConfig(model_config={"context_gate": False, "sequence_dropout": 0}).model_config == {
        "context_gate": False,
        "sequence_dropout": 0.0,
    }


def test_an_empty_set_value_is_the_empty_string_not_the_default(cli_config):
    from cde_st.training import resolved_prompts

    cfg = cli_config(["--preset", "tiny", "--set", "document_prompt=", "query_prompt=search_query: "])
    assert (cfg.document_prompt, resolved_prompts(cfg)) == ("", {"query": "search_query: ", "document": ""})


def test_the_mini_presets_biencoder_baseline_has_the_contextual_models_prompts(cli_config):
    # (cp) of docs/RESULTS.md is one --set away and compares like with like; (c) drops the prompts explicitly.
    from cde_st.training import resolved_prompts

    contextual = resolved_prompts(cli_config(["--preset", "mini"]))
    assert contextual == {"query": "search_query: ", "document": "search_document: "}
    assert resolved_prompts(cli_config(["--preset", "mini", "--set", "model=biencoder"])) == contextual
    plain = cli_config(["--preset", "mini", "--set", "model=biencoder", "query_prompt=", "document_prompt="])
    assert resolved_prompts(plain) == {"query": "", "document": ""}


def test_default_output_dirs_of_presets_model_kinds_and_seeds_differ(cli_config):
    # README lines without --output-dir must not write into one folder.
    argvs = [
        ["--preset", "mini"],
        ["--preset", "mini", "--set", "model=biencoder", "batching=random"],
        ["--preset", "mini", "--set", "seed=1"],
        ["--preset", "tiny"],
        ["--preset", "paper"],
        ["--set", "model=biencoder"],
        [],
    ]
    dirs = [cli_config(argv).output_dir for argv in argvs]
    assert len(set(dirs)) == len(dirs), dirs
    assert dirs[1] == "runs/mini-biencoder-s42"
    assert cli_config(["--preset", "mini", "--output-dir", "x"]).output_dir == "x"


@pytest.mark.parametrize("kind", ["folder", "not utf-8"])
def test_a_config_that_is_a_folder_or_not_utf8_is_a_one_line_error(tmp_path, capsys, kind):
    path = tmp_path / "cfg.yaml"
    if kind == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"seed: 1\nquery_prompt: caf\xe9\n")  # Latin-1
    with pytest.raises(SystemExit) as exc:
        train_main(["--config", str(path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and str(path) in err, err
    assert ("is a folder" in err) if kind == "folder" else ("line 2: not UTF-8" in err)


def test_presets_are_commented_yaml_files_in_the_package_and_load_as_configs(tmp_path):
    from cde_st.training import PRESET_DIR, PRESET_TIMES, PRESETS

    assert sorted(p.stem for p in PRESET_DIR.glob("*.yaml")) == sorted(PRESETS) == sorted(PRESET_TIMES)
    for name in PRESETS:
        text = (PRESET_DIR / f"{name}.yaml").read_text()
        assert text.startswith(f"# Preset `{name}`") and "wall_time:" in text
        copy = tmp_path / f"{name}.yaml"
        copy.write_text(text)  # a copied preset file is a config file of its own (its wall_time is informational)
        assert TrainConfig.from_file(copy, output_dir="x") == TrainConfig.from_preset(name, output_dir="x")
    assert "train_data" not in PRESETS["mini"] and "train_data" not in PRESETS["paper"]  # no repository path
    assert PRESETS["tiny"]["train_data"] == ["builtin:tiny"]


def test_repository_configs_name_the_shared_pairs():
    folder = Path(__file__).parents[2] / "train" / "configs"
    for path in folder.glob("*.yaml"):
        assert TrainConfig.from_file(path).train_data == ["../shared/data/pairs"], path


@pytest.mark.parametrize(
    "name, text, expected",
    [
        (
            "dup.yaml",
            "preset: tiny\nseed: 1\nlearning_rate: 1e-3\nseed: 2\n",
            r"dup\.yaml, line 4: key 'seed' appears twice",
        ),
        ("dup.json", '{\n  "seed": 1,\n  "seed": 2\n}\n', r"dup\.json, line 3: key 'seed' appears twice"),
        ("nested.yaml", "model_config:\n  context_gate: true\n  context_gate: false\n", r"'model_config.context_gate'"),
    ],
)
def test_a_config_file_with_a_duplicate_key_is_refused_naming_key_and_file(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=expected):
        TrainConfig.from_file(path)


def test_yaml_words_other_than_true_and_false_are_not_booleans(tmp_path, cli_config, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("preset: tiny\nexclude_domains: [no, off]\nlearning_rate: 2e-3\n")
    cfg = TrainConfig.from_file(path)
    assert cfg.exclude_domains == ["no", "off"] and cfg.learning_rate == 2e-3  # a domain named `no` is not False
    path.write_text("preset: tiny\nbidirectional: yes\n")
    with pytest.raises(ValueError, match=r"line 2: field 'bidirectional' = 'yes' \(str\): expected bool"):
        TrainConfig.from_file(path)
    with pytest.raises(SystemExit):
        cli_config(["--preset", "tiny", "--set", "bidirectional=no"])
    assert "'bidirectional' = 'no' (str): expected bool" in capsys.readouterr().err
    assert cli_config(["--preset", "tiny", "--set", "bidirectional=True"]).bidirectional is True


def test_an_unknown_key_in_a_config_file_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("preset: tiny\nmodel_config:\n  context_gates: true\n")
    with pytest.raises(ValueError, match=r"c\.yaml, line 2: .*unknown ContextualTransformer option 'context_gates'"):
        TrainConfig.from_file(path)


def test_command_lines_that_name_two_output_folders_or_two_presets_are_refused(tmp_path, cli_config, capsys):
    # a later --set item overrides an earlier one (appending to a command line is how a run is varied)
    assert cli_config(["--preset", "tiny", "--set", "seed=1", "learning_rate=1e-3", "seed=2"]).seed == 2
    with pytest.raises(SystemExit):
        cli_config(["--preset", "tiny", "--output-dir", "a", "--set", "output_dir=b"])
    assert "--output-dir a and --set output_dir=b" in capsys.readouterr().err
    path = tmp_path / "c.yaml"
    path.write_text("preset: mini\nseed: 3\n")
    with pytest.raises(SystemExit):
        cli_config(["--preset", "tiny", "--config", str(path)])
    assert f"--preset tiny and {path} (preset: mini)" in capsys.readouterr().err
    assert cli_config(["--preset", "mini", "--config", str(path)]).seed == 3  # the same preset twice is fine
