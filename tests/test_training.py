"""The training recipe: presets, config files, data loading, and the tiny preset end to end."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from cde_st import ContextualSentenceTransformer
from cde_st.cli import train_main
from cde_st.training import TrainConfig, load_pairs, train


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
    folder = Path(__file__).parents[1] / "train" / "configs"
    configs = {path.name: TrainConfig.from_file(path) for path in sorted(folder.glob("*.yaml"))}
    assert {"mini_contextual.yaml", "mini_contextual_j512.yaml"} <= set(configs)
    big, mini = configs["mini_contextual_j512.yaml"], TrainConfig.from_preset("mini")
    assert (big.context_size, big.batch_size, big.cluster_size, big.max_pairs) == (512, 512, 512, None)
    assert big.model_config == mini.model_config and big.context_dropout == mini.context_dropout


def test_load_pairs_jsonl_domains_exclusion_and_prompts(tmp_path):
    rows_a = [{"query": f"qa{i}", "document": f"da{i}", "domain": "a"} for i in range(5)]
    rows_b = [{"query": f"qb{i}", "document": f"db{i}"} for i in range(3)]  # no domain column: file name
    with gzip.open(tmp_path / "first.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows_a)
    (tmp_path / "second.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows_b))
    cfg = TrainConfig(train_data=[str(tmp_path)], domain_prompts={"second": {"query": "Q: "}})
    pairs = load_pairs(cfg)
    assert len(pairs) == 8 and sorted(set(pairs["domain"])) == ["a", "second"]
    assert "Q: qb0" in pairs["query"]
    pairs = load_pairs(TrainConfig(train_data=[str(tmp_path)], exclude_domains=["a"]))
    assert set(pairs["domain"]) == {"second"}
    pairs = load_pairs(TrainConfig(train_data=[str(tmp_path)], exclude_domains=["first"]))  # by file name
    assert set(pairs["domain"]) == {"second"}
    with pytest.raises(ValueError, match="No training pairs left"):
        load_pairs(TrainConfig(train_data=[str(tmp_path / "second.jsonl")], exclude_domains=["second"]))
    with pytest.raises(FileNotFoundError):
        load_pairs(TrainConfig(train_data=[str(tmp_path / "nope")]))


def test_load_pairs_from_beir_train_qrels(tmp_path):
    beir = tmp_path / "mini_beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "title": f"T{i}", "text": f"text {i}"}) + "\n" for i in range(4))
    )
    (beir / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": f"query {i}"}) + "\n" for i in range(3))
    )
    (beir / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td1\t1\nq1\td2\t1\nq2\td3\t0\n")
    pairs = load_pairs(TrainConfig(train_data=[f"beir:{beir}:train"]))
    assert list(pairs["query"]) == ["query 0", "query 1"]
    assert list(pairs["document"]) == ["T1 text 1", "T2 text 2"]
    assert set(pairs["domain"]) == {"mini_beir_train"}


@pytest.mark.slow
def test_tiny_preset_end_to_end_and_reload(tmp_path):
    cfg = TrainConfig.from_preset("tiny", output_dir=str(tmp_path / "run"))
    model = train(cfg)
    final = tmp_path / "run" / "final"
    assert (final / "README.md").exists()  # model card
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["steps"] == 4
    reloaded = ContextualSentenceTransformer(str(final))
    docs = ["a passage about rain", "a passage about coffee"]
    model.set_context(docs)
    reloaded.set_context(docs)
    np.testing.assert_allclose(reloaded.encode_document(docs), model.encode_document(docs), atol=1e-6)


@pytest.mark.slow
def test_cli_biencoder_random_batches_and_resume(tmp_path):
    out = tmp_path / "bi"
    common = [
        "--preset",
        "tiny",
        "--output-dir",
        str(out),
        "--set",
        "model=biencoder",
        "batching=random",
        "filter_false_negatives=false",
    ]
    train_main([*common, "max_steps=2"])
    assert (out / "checkpoint-2").is_dir()
    train_main([*common, "max_steps=4", "--resume"])  # training longer is not a config change
    assert json.loads((out / "train_summary.json").read_text())["steps"] == 4


@pytest.mark.slow
def test_cli_refuses_a_used_output_dir_and_overwrites_only_when_asked(tmp_path, capsys):
    out = tmp_path / "bi"
    common = ["--preset", "tiny", "--output-dir", str(out), "--set", "model=biencoder", "batching=random"]
    common += ["filter_false_negatives=false", "max_steps=4"]
    train_main(common)
    weights = (out / "checkpoint-4" / "model.safetensors").read_bytes()
    with pytest.raises(SystemExit):
        train_main(common)
    assert "--overwrite-output-dir" in capsys.readouterr().err
    assert (out / "checkpoint-4" / "model.safetensors").read_bytes() == weights
    with pytest.raises(SystemExit):
        train_main([*common, "learning_rate=1e-2", "--resume"])
    assert "learning_rate: 0.001 -> 0.01" in capsys.readouterr().err
    assert json.loads((out / "train_config.json").read_text())["learning_rate"] == 1e-3
    train_main([*common, "learning_rate=1e-2", "max_steps=2", "--overwrite-output-dir"])
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]  # the earlier run's are gone
    assert json.loads((out / "train_config.json").read_text())["learning_rate"] == 1e-2
    train_main([*common, "learning_rate=5e-3", "max_steps=3", "--resume", "--allow-config-change"])
    assert json.loads((out / "train_summary.json").read_text())["steps"] == 3


def test_optimizer_gives_added_parameters_their_own_learning_rate(make_tiny_cde):
    from cde_st.training import TrainConfig, build_optimizer

    model = make_tiny_cde(context_size=4, context_gate=True)
    cfg = TrainConfig(learning_rate=1e-5, added_params_lr=1e-3, weight_decay=0.1)
    optimizer = build_optimizer(cfg, model)
    lr_of = {id(p): (g["lr"], g["weight_decay"]) for g in optimizer.param_groups for p in g["params"]}
    module = model.contextual_module
    assert lr_of[id(module.gates)] == (1e-3, 0.0)
    assert lr_of[id(module.head.fc1.weight)] == (1e-3, 0.1)
    assert lr_of[id(module.null_vector)] == (1e-3, 0.0)
    layer = module.second_stage.encoder.layer[0]
    assert lr_of[id(layer.attention.self.query.weight)] == (1e-5, 0.1)
    assert lr_of[id(layer.attention.self.query.bias)] == (1e-5, 0.0)
    assert len(lr_of) == sum(1 for p in model.parameters() if p.requires_grad)
    same = build_optimizer(TrainConfig(learning_rate=1e-5), model)
    assert {g["lr"] for g in same.param_groups} == {1e-5}


# ------------------------------------------------------------------ config fields are type-checked when read
def _cli_config(monkeypatch, argv):
    """The TrainConfig that ``train_main(argv)`` would train (training itself replaced by a recorder)."""
    import cde_st.training

    seen = {}
    monkeypatch.setattr(cde_st.training, "train", lambda cfg, **kwargs: seen.setdefault("cfg", cfg))
    train_main(argv)
    return seen["cfg"]


def test_set_overrides_are_coerced_to_the_field_types(monkeypatch, tmp_path):
    cfg = _cli_config(
        monkeypatch,
        ["--preset", "tiny", "--output-dir", str(tmp_path / "o"), "--set", "learning_rate=1e-3", "train_data=a.jsonl"],
    )
    assert cfg.learning_rate == 1e-3 and isinstance(cfg.learning_rate, float)  # YAML reads "1e-3" as a string
    assert cfg.train_data == ["a.jsonl"]  # a single path, not its characters
    cfg = _cli_config(monkeypatch, ["--preset", "tiny", "--set", "max_steps=6.0", "added_params_lr=3", "guide=null"])
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
def test_set_overrides_with_wrong_types_name_field_value_and_type(monkeypatch, capsys, item, expected):
    import re

    with pytest.raises(SystemExit) as exc:
        _cli_config(monkeypatch, ["--preset", "tiny", "--set", item])
    message = capsys.readouterr().err + str(exc.value.code)
    assert "--set" in message and re.search(expected, message), message


def test_batch_sampler_gets_the_surrogate_kind(tmp_path):
    from datasets import Dataset

    from cde_st.training import build_batch_sampler

    pairs = Dataset.from_dict({"query": ["q"] * 4, "document": ["d"] * 4, "domain": ["a"] * 4})
    tiny = TrainConfig.from_preset("tiny", output_dir=str(tmp_path))  # its surrogate, the tiny encoder, is built there
    assert build_batch_sampler(tiny, pairs).keywords["surrogate_kind"] == "transformer"
    fast = build_batch_sampler(TrainConfig.from_preset("tiny", surrogate_kind="static", output_dir=str(tmp_path)), pairs)
    assert fast.keywords["surrogate_kind"] == "static"


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


# ------------------------------------------------------------------ output folders of earlier runs are protected
def _fake_run(folder, cfg):
    """An output folder as a run of ``cfg`` leaves it: train_config.json, a checkpoint, a final model."""
    (folder / "checkpoint-2").mkdir(parents=True)
    (folder / "checkpoint-2" / "model.safetensors").write_text("weights of the earlier run")
    (folder / "final").mkdir()
    (folder / "train_config.json").write_text(json.dumps(cfg.to_dict(), indent=2))


def test_existing_output_dir_is_refused_without_resume_or_overwrite(tmp_path):
    out = tmp_path / "run"
    cfg = TrainConfig.from_preset("tiny", output_dir=str(out), model="biencoder", batching="random")
    _fake_run(out, cfg)
    with pytest.raises(FileExistsError, match=r"run.*checkpoint-2.*--resume.*--overwrite-output-dir"):
        train(cfg)
    assert (out / "checkpoint-2" / "model.safetensors").read_text() == "weights of the earlier run"


def test_resume_with_a_changed_config_is_refused_and_lists_the_fields(tmp_path):
    out = tmp_path / "run"
    cfg = TrainConfig.from_preset("tiny", output_dir=str(out), model="biencoder", batching="random")
    _fake_run(out, cfg)
    before = (out / "train_config.json").read_text()
    changed = TrainConfig.from_preset(
        "tiny", output_dir=str(out), model="biencoder", batching="random", learning_rate=5e-3, temperature=0.05
    )
    with pytest.raises(ValueError, match=r"changed config") as err:
        train(changed, resume=True)
    message = str(err.value)
    assert "learning_rate: 0.001 -> 0.005" in message and "temperature: 0.02 -> 0.05" in message
    assert "allow-config-change" in message and "train_config.json" in message
    assert (out / "train_config.json").read_text() == before


def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path):
    cfg = TrainConfig.from_preset("tiny", output_dir=str(tmp_path / "empty"), model="biencoder", batching="random")
    with pytest.raises(FileNotFoundError, match=r"empty.*no checkpoint"):
        train(cfg, resume=True)


# ------------------------------------------------------------------ malformed training data names file and line
@pytest.mark.parametrize(
    "bad_line, expected",
    [
        ('{"query": "q2", "document": "d2"', r"line 3: invalid JSON"),
        ('{"query": "q2"}', r"line 3: missing field\(s\) \['document'\]"),
        ('{"query": 7, "document": "d2"}', r"line 3: field 'query' must be a string, got int 7"),
        ('{"query": "q2", "document": null}', r"line 3: field 'document' must be a string, got NoneType"),
        ('{"query": "q2", "document": "d2", "domain": ["x"]}', r"line 3: field 'domain' must be a string"),
        ('["q2", "d2"]', r"line 3: expected a JSON object .*got list"),
    ],
)
@pytest.mark.parametrize("compressed", [False, True])
def test_malformed_jsonl_names_file_and_line(tmp_path, bad_line, expected, compressed):
    import re

    lines = ['{"query": "q0", "document": "d0"}', "", bad_line, '{"query": "q3", "document": "d3"}']
    text = "\n".join(lines) + "\n"
    path = tmp_path / ("pairs.jsonl.gz" if compressed else "pairs.jsonl")
    if compressed:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(str(path)) + ", " + expected):
        load_pairs(TrainConfig(train_data=[str(tmp_path)]))


def test_jsonl_with_extra_fields_and_blank_lines_loads(tmp_path):
    rows = ['{"query": "q0", "document": "d0", "score": 1}', "", '{"query": "q1", "document": "d1", "domain": "x"}']
    (tmp_path / "p.jsonl").write_text("\n".join(rows) + "\n")
    pairs = load_pairs(TrainConfig(train_data=[str(tmp_path / "p.jsonl")]))
    assert pairs.column_names == ["query", "document", "domain"]
    assert list(pairs["domain"]) == ["p", "x"] and list(pairs["query"]) == ["q0", "q1"]
    (tmp_path / "broken.jsonl.gz").write_bytes(gzip.compress(b'{"query": "q", "document": "d"}\n' * 50)[:40])
    with pytest.raises(ValueError, match=r"broken\.jsonl\.gz, line 1: cannot read the file"):
        load_pairs(TrainConfig(train_data=[str(tmp_path / "broken.jsonl.gz")]))


# ---- issue 24: zero/None mean what the docs say, inputs are never deleted; issue 23: output folders, resume


@pytest.mark.parametrize(
    "values, expected",
    [
        (dict(seed=-1), r"'seed' = -1: must be in \[0, 2\*\*32 - 1\]"),
        (dict(cluster_size=0), r"'cluster_size' = 0: must be >= 1, or null for the batch size"),
        (dict(eval_steps=0), r"'eval_steps' = 0: must be >= 1, or null to evaluate only at the end"),
        (dict(max_pairs=0), r"'max_pairs' = 0: must be >= 1, or null for all pairs"),
        (dict(margin=10), r"'margin' = 10.0: .*a margin >= 2 filters every negative"),
        (dict(margin=float("nan")), r"'margin' = nan: must be a finite number"),
        (dict(added_params_lr=-1e-3), r"'added_params_lr' = -0.001: must be a finite number >= 0"),
        (dict(model_config={"context_gate": "false"}), r"model_config.context_gate' = 'false' \(str\): expected bool"),
        (dict(model_config={"soft_prompt_tokens": 2.5}), r"model_config.soft_prompt_tokens' = 2.5 .*expected int"),
        (dict(model_config={"context_size": 4.5}), r"model_config.context_size: context_size is a TrainConfig field"),
        (dict(model_config={"context_gates": True}), r"unknown ContextualTransformer option 'context_gates'.*context_gate"),
        (dict(context_size=4.5), r"'context_size' = 4.5 \(float\): expected int"),
        (dict(model="biencoder", model_config={"context_gate": True}), r"model_config .* only applies to model: contextual"),
    ],
)
def test_zero_none_and_out_of_range_fields_are_errors_that_name_the_field(values, expected):
    from cde_st.training import TrainConfigError

    with pytest.raises(TrainConfigError, match=expected):
        TrainConfig(**values)


def test_preset_model_config_is_dropped_for_a_biencoder_and_kept_for_a_contextual_model():
    assert TrainConfig.from_preset("mini", model="biencoder").model_config == {}
    assert TrainConfig.from_preset("mini").model_config["context_gate"] is True
    assert TrainConfig(model_config={"context_gate": False, "sequence_dropout": 0}).model_config == {
        "context_gate": False,
        "sequence_dropout": 0.0,
    }


def test_added_params_lr_zero_freezes_the_added_parameters(make_tiny_cde):
    from cde_st.training import build_optimizer

    model = make_tiny_cde(context_size=4, context_gate=True)
    optimizer = build_optimizer(TrainConfig(learning_rate=1e-5, added_params_lr=0.0), model)
    lr_of = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
    assert lr_of[id(model.contextual_module.gates)] == 0.0
    assert lr_of[id(model.contextual_module.second_stage.encoder.layer[0].attention.self.query.weight)] == 1e-5


def test_cluster_size_none_is_the_batch_size():
    from datasets import Dataset

    from cde_st.training import build_batch_sampler

    pairs = Dataset.from_dict({"query": ["q"] * 20, "document": ["d"] * 20, "domain": ["a"] * 20})
    assert build_batch_sampler(TrainConfig(batch_size=8), pairs).keywords["cluster_size"] == 8
    assert build_batch_sampler(TrainConfig(batch_size=8, cluster_size=4), pairs).keywords["cluster_size"] == 4


def test_an_empty_set_value_is_the_empty_string_not_the_default(monkeypatch, tmp_path):
    from cde_st.training import resolved_prompts

    cfg = _cli_config(monkeypatch, ["--preset", "tiny", "--set", "document_prompt=", "query_prompt=search_query: "])
    assert (cfg.document_prompt, resolved_prompts(cfg)) == ("", {"query": "search_query: ", "document": ""})


def test_default_output_dirs_of_presets_model_kinds_and_seeds_differ(monkeypatch):
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
    dirs = [_cli_config(monkeypatch, argv).output_dir for argv in argvs]
    assert len(set(dirs)) == len(dirs), dirs
    assert dirs[1] == "runs/mini-biencoder-s42"
    assert _cli_config(monkeypatch, ["--preset", "mini", "--output-dir", "x"]).output_dir == "x"


@pytest.mark.parametrize("inside", ["final", "checkpoint-2"])
def test_overwrite_refuses_to_remove_an_input_of_the_run(tmp_path, capsys, inside):
    out = tmp_path / "run"
    for name in ("final", "checkpoint-2"):
        (out / name).mkdir(parents=True)
        (out / name / "model.safetensors").write_bytes(b"weights of " + name.encode())
    argv = ["--preset", "tiny", "--output-dir", str(out), "--overwrite-output-dir"]
    argv += ["--set", "model=continue", f"init_from={out / inside}"]
    with pytest.raises(SystemExit) as exc:
        train_main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert "init_from" in err and "Nothing was removed" in err
    for name in ("final", "checkpoint-2"):
        assert (out / name / "model.safetensors").read_bytes() == b"weights of " + name.encode()


def test_overwrite_refuses_to_remove_training_data_inside_the_output_folder(tmp_path):
    from cde_st.training import OutputDirError, prepare_output_dir

    out = tmp_path / "run"
    (out / "checkpoint-1").mkdir(parents=True)
    data = out / "checkpoint-1" / "pairs.jsonl"
    data.write_text('{"query": "q", "document": "d"}\n')
    cfg = TrainConfig.from_preset("tiny", output_dir=str(out), train_data=[str(data)])
    with pytest.raises(OutputDirError, match=r"train_data\[0\]"):
        prepare_output_dir(cfg, overwrite_output_dir=True)
    assert data.exists()


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


def test_lone_surrogate_in_training_data_names_file_line_and_field(tmp_path):
    from cde_st.training import TrainingDataError

    path = tmp_path / "pairs.jsonl"
    path.write_text('{"query": "q", "document": "d"}\n{"query": "q", "document": "broken \\udc80 text"}\n')
    cfg = TrainConfig(train_data=[str(path)])
    with pytest.raises(TrainingDataError, match=r"pairs.jsonl, line 2: field 'document' holds a lone surrogate"):
        load_pairs(cfg)


def test_train_cli_is_quiet_about_dependencies_but_keeps_its_own_progress(monkeypatch):
    import logging

    import cde_st.training

    monkeypatch.setattr(cde_st.training, "train", lambda cfg, **kwargs: None)
    root = logging.getLogger()
    before = root.level
    root.setLevel(logging.INFO)  # as a caller's (or the old) basicConfig(level=INFO) left it
    try:
        train_main(["--preset", "tiny"])
        assert not logging.getLogger("faiss.loader").isEnabledFor(logging.INFO)
        assert not logging.getLogger("datasets").isEnabledFor(logging.INFO)
        assert logging.getLogger("cde_st.training").isEnabledFor(logging.INFO)
    finally:
        root.setLevel(before)


@pytest.mark.slow
def test_resume_of_a_finished_run_changes_nothing(tmp_path, capsys):
    out = tmp_path / "tiny"
    argv = ["--preset", "tiny", "--output-dir", str(out), "--set", "max_steps=2"]
    train_main(argv)

    def snapshot():
        return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    before = snapshot()
    assert any(name.startswith("final/") for name in before)
    capsys.readouterr()
    train_main([*argv, "--resume"])  # exit status 0: nothing to do is not an error
    err = capsys.readouterr().err
    assert "is finished" in err and "step 2" in err and "Nothing was changed" in err, err
    assert snapshot() == before
