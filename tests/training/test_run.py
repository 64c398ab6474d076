"""cde_st.training.run: the tiny preset end to end, the optimizer, batch sampler and logging of a run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cde_st import ContextualSentenceTransformer
from cde_st.cli import train_main
from cde_st.training import TrainConfig, train


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


def test_batch_sampler_gets_the_surrogate_kind(tmp_path):
    from datasets import Dataset

    from cde_st.training import build_batch_sampler

    pairs = Dataset.from_dict({"query": ["q"] * 4, "document": ["d"] * 4, "domain": ["a"] * 4})
    tiny = TrainConfig.from_preset("tiny", output_dir=str(tmp_path))  # its surrogate, the tiny encoder, is built there
    assert build_batch_sampler(tiny, pairs).keywords["surrogate_kind"] == "transformer"
    fast = build_batch_sampler(
        TrainConfig.from_preset("tiny", surrogate_kind="static", output_dir=str(tmp_path)), pairs
    )
    assert fast.keywords["surrogate_kind"] == "static"


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


# ------------------------------------------------------------------------------ data that cannot teach anything
def _write_pairs(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    "rows, expected",
    [
        (
            [{"query": f"text {i}", "document": f"text {i}"} for i in range(16)],
            r"every query is identical to its document",
        ),
        ([{"query": "one question", "document": "one answer"}], r"only 1 pair"),
        ([{"query": f"q {i}", "document": "the same page"} for i in range(16)], r"every document is the same text"),
        ([{"query": "same question", "document": f"d {i}"} for i in range(16)], r"every query is the same text"),
        (
            [{"query": f"q {i}", "document": "   " if i == 3 else f"d {i}"} for i in range(16)],
            r"pairs\.jsonl:4: .*'document' is empty",
        ),
        (
            [{"query": "" if i == 0 else f"q {i}", "document": f"d {i}"} for i in range(16)],
            r"pairs\.jsonl:1: .*'query' is empty",
        ),
    ],
)
def test_training_data_that_cannot_teach_anything_is_refused_naming_the_file(tmp_path, capsys, rows, expected):
    import re

    data = _write_pairs(tmp_path / "pairs.jsonl", rows)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        train_main(["--preset", "tiny", "--output-dir", str(out), "--set", f"train_data={data}"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1, err
    assert re.search(expected, err) and "pairs.jsonl" in err, err
    assert not (out / "final").exists()


def test_a_batch_of_one_pair_is_refused(tmp_path):
    from cde_st.training import TrainConfigError

    with pytest.raises(TrainConfigError, match=r"'batch_size' = 1: .*batch_size = 1 .*only candidate.*loss is 0"):
        TrainConfig.from_preset("tiny", output_dir=str(tmp_path / "run"), batch_size=1, cluster_size=1)


def test_a_loss_that_is_zero_at_every_step_is_reported(tmp_path, caplog):
    """Guide and model agree that every in-batch negative is as relevant as the positive (margin near 2): the
    filter drops them all, the loss is 0 and nothing is learned; the run says so."""
    cfg = TrainConfig.from_preset("tiny", output_dir=str(tmp_path / "run"), margin=1.999, max_steps=2, save_steps=100)
    with caplog.at_level("WARNING"):
        train(cfg)
    assert "training loss was 0 at every logged step" in caplog.text


def test_pairs_that_are_mostly_repeats_are_reported(tmp_path, caplog):
    from datasets import Dataset

    from cde_st.training.pairs import check_pairs_can_teach

    rows = [{"query": f"q {i % 3}", "document": f"d {i % 3}", "domain": "x"} for i in range(12)]
    with caplog.at_level("WARNING"):
        check_pairs_can_teach(Dataset.from_list(rows), ["pairs.jsonl"])
    assert "pairs.jsonl: 9 of 12 pairs repeat another pair" in caplog.text
