"""evaluate_model end to end on tiny local data, and the cde-st-eval command line over it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from evaluation_helpers import (
    loaded,
)

from cde_st.context import sample_context
from cde_st.evaluation import runner
from cde_st.evaluation.pools import context_pool
from cde_st.evaluation.random_corpus import foreign_pool, load_text_corpus


def test_end_to_end_plain_model(data_dir, tmp_path, tiny_plain_model):
    from cde_st.evaluation import evaluate_model

    out = tmp_path / "out"
    tasks = ["tinyret", "tinysts", "tinycls", "tinyclu", str(data_dir / "pair_classification" / "tinypair")]
    result = evaluate_model(
        tiny_plain_model,
        tasks,
        data_dir=data_dir,
        output_dir=out,
        batch_size=8,
        show_progress_bar=False,
        model_name="test/tiny-plain",
        context_size=[4, 8],  # ignored for a plain model
    )
    assert len(result.runs) == 1 and result.runs[0].context == "none"
    assert result.runs[0].context_log == []
    scores = {s.task: s for s in result.scores}
    assert set(scores) == {"tinyret", "tinysts", "tinycls", "tinyclu", "tinypair"}
    assert all(0.0 <= s.score <= 100.0 or s.task == "tinysts" for s in scores.values())
    assert scores["tinycls"].metric == "accuracy" and scores["tinyret"].metric == "ndcg_at_10"
    jsons = sorted(p.name for p in (out / "results").rglob("*.json") if p.name != "model_meta.json")
    assert jsons == sorted(f"{t}.json" for t in scores)
    saved = json.loads(next((out / "results").rglob("tinyret.json")).read_text())
    assert saved["task_name"] == "tinyret" and "ndcg_at_10" in saved["scores"]["test"][0]
    meta = json.loads(next((out / "results").rglob("model_meta.json")).read_text())
    assert meta["name"] == "test/tiny-plain" and meta["experiment_kwargs"]["context"] == "none"
    md = result.files["summary_md"].read_text()
    assert "| Class. | Clust. | PairClass. | Rerank | Retrieval | STS | Summ. | Avg |" in md
    assert "tinypair" in md and result.files["summary_csv"].read_text().count("\n") == 1 + 5 + 6


def test_cli_reports_errors(data_dir, tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_mteb", Path(__file__).parents[2] / "eval" / "run_mteb.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    assert cli.main(["--model", str(tmp_path / "nope"), "--tasks", "tinyret", "--data-dir", str(data_dir)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli.main(["--model", str(tmp_path), "--tasks", "tinyret", "--prefix", "oops"]) == 2
    # the console entry point ``cde-st-eval`` runs the same command and exits with its status
    from cde_st.cli import eval_main, eval_run

    assert cli.main is eval_run
    with pytest.raises(SystemExit) as exit_info:
        eval_main(["--model", str(tmp_path / "nope"), "--tasks", "tinyret", "--data-dir", str(data_dir)])
    assert exit_info.value.code == 2


def test_contextual_model_context_from_the_right_pool(data_dir, tmp_path, make_tiny_cde, monkeypatch):
    from cde_st.evaluation import evaluate_model, wrapper

    model = make_tiny_cde(context_size=8)
    seen = []
    original = wrapper.set_model_context

    def spy(model, texts, seed, prompt, batch_size=32):
        seen.append((list(texts), prompt))
        return original(model, texts, seed=seed, prompt=prompt, batch_size=batch_size)

    monkeypatch.setattr(wrapper, "set_model_context", spy)
    result = evaluate_model(
        model,
        ["tinyret", "tinycls"],
        data_dir=data_dir,
        output_dir=tmp_path / "out",
        batch_size=8,
        context_size=[0, 4, 8],
        context_seed=1,
        show_progress_bar=False,
        model_name="test/tiny-cde",
    )
    assert [r.context_size for r in result.runs] == [0, 4, 8]
    ret = loaded(data_dir / "retrieval" / "tinyret")
    cls = loaded(data_dir / "classification" / "tinycls")
    corpus, train = context_pool(ret, "default", "test"), context_pool(cls, "default", "test")
    # J=4 and J=8: one context per task (queries and documents, train and test share it), from the right pool
    assert seen == [
        (sample_context(corpus, 4, 1), "search_document: "),
        (sample_context(corpus, 8, 1), "search_document: "),
        (sample_context(train, 4, 1), "classification: "),
        (sample_context(train, 8, 1), "classification: "),
    ]
    log = {r.context_size: r.context_log for r in result.runs}
    assert [(e["task"], e["size"]) for e in log[0]] == [("tinyret", 0), ("tinycls", 0)]
    assert [e["task"] for e in log[8]] == ["tinyret", "tinycls"] and log[8][0]["pool_size"] == 12
    assert model.context_info is None  # the run leaves no context behind
    # the settings are part of the result path, so runs never collide
    experiments = {p.parent.name for p in (tmp_path / "out" / "results").rglob("tinyret.json")}
    assert len(experiments) == 3 and any("context_size_8" in e for e in experiments)
    assert result.files["sweep_png"].is_file() and result.files["sweep_md"].is_file()


def test_contextual_context_changes_scores_and_random_mode(data_dir, tmp_path, make_tiny_cde):
    from cde_st.evaluation import evaluate_model

    model = make_tiny_cde(context_size=8)
    corpus_run = evaluate_model(
        model,
        ["tinysts"],
        data_dir=data_dir,
        output_dir=None,
        batch_size=8,
        context_size=[0, 8],
        show_progress_bar=False,
    )
    pearson = [run.task_results[0].scores["test"][0]["cosine_pearson"] for run in corpus_run.runs]
    assert pearson[0] != pytest.approx(pearson[1], abs=1e-6)  # the context changes the embeddings
    random_run = evaluate_model(
        model,
        ["tinysts", "tinyclu"],
        data_dir=data_dir,
        output_dir=None,
        batch_size=8,
        context="random",
        context_size=8,
        show_progress_bar=False,
    )
    entry = next(e for e in random_run.runs[0].context_log if e["task"] == "tinysts")
    assert entry["source"] == "random-for:tinysts" and entry["pool_size"] == 8  # J of each other task's pool
    assert random_run.runs[0].experiment_kwargs["random_corpus"] == "other-tasks"
    # the random context of a task comes from the other tasks' pools only
    sts, clu = loaded(data_dir / "sts" / "tinysts"), loaded(data_dir / "clustering" / "tinyclu")
    foreign, name = foreign_pool([sts, clu], None, data_dir, max_size=8, seed=0)
    assert name == "other-tasks"
    assert set(foreign("tinysts")) <= set(context_pool(clu, "default", "test"))
    assert set(foreign("tinyclu")) <= set(context_pool(sts, "default", "test"))
    with pytest.raises(ValueError, match="only one task"):
        evaluate_model(model, ["tinysts"], data_dir=data_dir, output_dir=None, context="random")
    fixed = evaluate_model(
        model,
        ["tinysts"],
        data_dir=data_dir,
        output_dir=None,
        context="random",
        random_corpus="tinyclu",
        batch_size=8,
        show_progress_bar=False,
    )
    assert fixed.runs[0].experiment_kwargs["random_corpus"] == "tinyclu"
    with pytest.raises(ValueError, match="exceed"):
        evaluate_model(model, ["tinysts"], data_dir=data_dir, output_dir=None, context_size=9)


def test_contextual_model_without_slots_scores_like_its_plain_encoder(data_dir, tiny_bert_dir, tiny_plain_model):
    """A CDE model with J = 0 slots, an identity output head and no prompts is its backbone: the kit must give
    the same scores for it as for the plain bi-encoder (the real-MiniLM version of this is in docs/RESULTS.md)."""
    from cde_st import ContextualSentenceTransformer
    from cde_st.evaluation import evaluate_model

    cde = ContextualSentenceTransformer.from_encoder(
        tiny_bert_dir, context_size=0, output_head="residual_mlp", max_seq_length=64, prompts={}
    )
    cde.eval()
    kwargs = dict(data_dir=data_dir, output_dir=None, batch_size=8, show_progress_bar=False)
    plain = evaluate_model(tiny_plain_model, ["tinyret", "tinysts"], **kwargs)
    contextual = evaluate_model(cde, ["tinyret", "tinysts"], prefixes=False, **kwargs)
    for task in ("tinyret", "tinysts"):
        assert contextual.score(task) == pytest.approx(plain.score(task), abs=1e-4)
    prefixed = evaluate_model(cde, ["tinysts"], **kwargs)  # prefixes default on for contextual models
    assert prefixed.runs[0].experiment_kwargs["prefixes"] == "nomic"


def test_random_corpus_and_context_seed_errors_name_the_option(data_dir, tmp_path, tiny_plain_model, capsys):
    """a missing --random-corpus file was reported as an unknown task; --context-seed -1 as a numpy
    error naming no option."""
    with pytest.raises(FileNotFoundError, match=r"random_corpus \(--random-corpus\) '.*missing.jsonl': no such file"):
        load_text_corpus(str(tmp_path / "missing.jsonl"), data_dir)
    with pytest.raises(runner.UnknownTaskError, match=r"random_corpus \(--random-corpus\) 'nosuchtask'"):
        load_text_corpus("nosuchtask", data_dir)
    with pytest.raises(ValueError, match=r"context_seed \(--context-seed\) must be an integer in \[0, 2\*\*32\)"):
        runner.evaluate_model(tiny_plain_model, ["tinyret"], data_dir=data_dir, context_seed=-1, output_dir=None)
    from cde_st.cli import eval_run

    # the command refuses it when reading its arguments (command_line.Number): one line naming it, exit status 2
    with pytest.raises(SystemExit) as stopped:
        eval_run(["--model", str(tmp_path), "--tasks", "tinyret", "--context-seed", "-1"])
    assert stopped.value.code == 2
    assert "--context-seed" in capsys.readouterr().err


def test_cli_output_lands_in_one_ignored_folder_and_faiss_loader_is_quiet(tmp_path):
    """results went to ./mteb_results (untracked, beside an mteb_cache/), and faiss's "Could not load
    library with AVX512 support" INFO lines read like errors."""
    import logging
    import subprocess

    from cde_st.cli import _eval_parser, eval_run

    args = _eval_parser().parse_args(["--model", "m", "--tasks", "t"])
    assert args.output_dir == runner.DEFAULT_OUTPUT_DIR == "outputs/mteb"
    repo = Path(__file__).resolve().parents[2]
    for path in (f"{runner.DEFAULT_OUTPUT_DIR}/results/x.json", "mteb_results/x.json", "mteb_cache/x.json"):
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=repo, check=False, capture_output=True)
        assert ignored.returncode in (0, 128), f"{path} is not git-ignored"  # 128: not a git checkout (sdist)
    loader = logging.getLogger("faiss.loader")
    before = logging.getLogger("faiss").level
    try:
        assert eval_run(["--model", str(tmp_path / "nope"), "--tasks", "t"]) == 2
        assert not loader.isEnabledFor(logging.INFO) and loader.isEnabledFor(logging.WARNING)
    finally:
        logging.getLogger("faiss").setLevel(before)


def test_the_kit_emits_no_future_warnings(data_dir, make_tiny_cde):
    """FutureWarnings on every evaluation read as errors. The ones seen come from mteb building a ModelMeta
    from a bare SentenceTransformer (``get_sentence_embedding_dimension`` renamed in sentence-transformers 6), which
    happens only when mteb is called directly; the kit hands mteb its own ModelMeta, so none may appear here."""
    import warnings

    from cde_st.evaluation import evaluate_model

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        evaluate_model(
            make_tiny_cde(context_size=4),
            ["tinyret", "tinysts", "tinycls", "tinyclu", "tinypair"],
            data_dir=data_dir,
            output_dir=None,
            batch_size=8,
            show_progress_bar=False,
        )
    future = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if issubclass(w.category, FutureWarning)]
    assert not future, future
