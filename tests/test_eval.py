"""The MTEB evaluation kit: local task loaders, context pools, prefixes, the wrapper and the runner (tiny data)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from cde_st.context import sample_context
from cde_st.evaluation import local_tasks, report, runner
from cde_st.evaluation.local_tasks import LocalDataError, detect_kind, load_local_task, read_jsonl, read_qrels
from cde_st.evaluation.pools import ContextPlan, context_pool
from cde_st.evaluation.wrapper import TaskPrefixes

# ------------------------------------------------------------------------------------------------------------
# Tiny local data in the five formats of ../shared/data


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return path


TOPICS = ["apples are red fruit", "the stock market fell", "rain falls from clouds", "cats chase mice"]


def make_retrieval(root: Path, name: str = "tinyret") -> Path:
    folder = root / "retrieval" / name
    corpus = [{"_id": f"d{i}", "title": f"Doc {i}", "text": f"{TOPICS[i % 4]} variant {i}"} for i in range(12)]
    queries = [{"_id": f"q{i}", "text": f"QUERY-ONLY question about {TOPICS[i % 4]}"} for i in range(6)]
    _write_jsonl(folder / "corpus.jsonl.gz", corpus)
    _write_jsonl(folder / "queries.jsonl", queries)
    (folder / "qrels").mkdir()
    lines = ["query-id\tcorpus-id\tscore"] + [f"q{i}\td{i}\t1" for i in range(6)]
    (folder / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n")
    return folder


def make_sts(root: Path, name: str = "tinysts") -> Path:
    folder = root / "sts" / name
    rows = [
        {"sentence1": f"{TOPICS[i % 4]} {i}", "sentence2": f"{TOPICS[(i * 3) % 4]} again {i}", "score": float(i % 6)}
        for i in range(10)
    ]
    rows.append(dict(rows[0]))  # a repeated pair: the pool must not count its sentences twice
    _write_jsonl(folder / "test.jsonl", rows)
    return folder


def make_classification(root: Path, name: str = "tinycls") -> Path:
    folder = root / "classification" / name
    train = [{"text": f"TRAIN {TOPICS[i % 4]} {i}", "label": ["a", "b", "c", "d"][i % 4]} for i in range(16)]
    test = [{"text": f"TEST {TOPICS[i % 4]} {i}", "label": ["a", "b", "c", "d"][i % 4]} for i in range(8)]
    _write_jsonl(folder / "train.jsonl", train)
    _write_jsonl(folder / "test.jsonl", test)
    return folder


def make_clustering(root: Path, name: str = "tinyclu") -> Path:
    folder = root / "clustering" / name
    _write_jsonl(folder / "test.jsonl", [{"text": f"{TOPICS[i % 4]} item {i}", "label": i % 4} for i in range(12)])
    return folder


def make_pairs(root: Path, name: str = "tinypair") -> Path:
    folder = root / "pair_classification" / name
    rows = [
        {"sentence1": f"{TOPICS[i % 4]} {i}", "sentence2": f"{TOPICS[(i + i % 2) % 4]} b{i}", "label": 1 - i % 2}
        for i in range(10)
    ]
    _write_jsonl(folder / "test.jsonl", rows)
    return folder


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    for make in (make_retrieval, make_sts, make_classification, make_clustering, make_pairs):
        make(root)
    return root


@pytest.fixture(scope="session")
def tiny_plain_model(tiny_bert_dir):
    """A plain (non-contextual) sentence-transformers bi-encoder on the tiny random BERT."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling

    torch.manual_seed(0)
    transformer = Transformer(tiny_bert_dir, max_seq_length=64)
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension())])
    model.eval()
    return model


def _loaded(folder: Path):
    task = load_local_task(folder)
    task.load_data()
    return task


# ------------------------------------------------------------------------------------------------------------
# Loaders


def test_detect_kind_from_type_folder_and_from_files(data_dir, tmp_path):
    for kind in local_tasks.TASK_KINDS:
        (folder,) = (data_dir / kind).iterdir()
        assert detect_kind(folder) == kind
    # outside a type folder the files decide
    assert detect_kind(make_retrieval(tmp_path / "x", "a").rename(tmp_path / "ret")) == "retrieval"
    assert detect_kind(make_sts(tmp_path / "x", "b").rename(tmp_path / "sts")) == "sts"
    assert detect_kind(make_pairs(tmp_path / "x", "c").rename(tmp_path / "pc")) == "pair_classification"
    assert detect_kind(make_classification(tmp_path / "x", "d").rename(tmp_path / "cls")) == "classification"
    assert detect_kind(make_clustering(tmp_path / "x", "e").rename(tmp_path / "clu")) == "clustering"


def test_load_retrieval_folder(data_dir):
    task = _loaded(data_dir / "retrieval" / "tinyret")
    assert task.metadata.name == "tinyret" and task.metadata.main_score == "ndcg_at_10"
    split = task.dataset["default"]["test"]
    assert len(split["corpus"]) == 12 and split["corpus"][0]["title"] == "Doc 0"
    assert len(split["queries"]) == 6
    assert split["relevant_docs"]["q3"] == {"d3": 1}


def test_load_sts_classification_clustering_pairs(data_dir):
    sts = _loaded(data_dir / "sts" / "tinysts")
    assert sts.metadata.main_score == "cosine_spearman" and len(sts.dataset["test"]) == 11
    cls = _loaded(data_dir / "classification" / "tinycls")
    assert cls.metadata.main_score == "accuracy" and set(cls.dataset) == {"train", "test"}
    clu = _loaded(data_dir / "clustering" / "tinyclu")
    assert clu.metadata.main_score == "v_measure" and len(clu.dataset["test"][0]["sentences"]) == 12
    pair = _loaded(data_dir / "pair_classification" / "tinypair")
    assert pair.metadata.main_score == "max_ap" and pair.dataset["test"]["labels"][:2] == [1, 0]


def test_local_copy_of_an_mteb_task_reuses_its_definition(tmp_path):
    folder = make_classification(tmp_path, "tweet_sentiment_extraction")
    task = load_local_task(folder)
    assert task.metadata.name == "tweet_sentiment_extraction"
    assert type(task).__mro__[2].__name__ == "TweetSentimentExtractionClassification"
    assert task.samples_per_label == 32 and task.n_experiments == 10
    assert task.metadata.superseded_by is None and task.metadata.adapted_from == [
        "TweetSentimentExtractionClassification"
    ]
    amazon = load_local_task(make_classification(tmp_path, "amazon_counterfactual_en"))
    assert amazon.hf_subsets == ["en"] and amazon.metadata.eval_splits == ["test"]  # no validation file here
    other = make_classification(tmp_path, "my_reviews")
    assert load_local_task(other, twin="AmazonCounterfactualClassification:de").hf_subsets == ["de"]
    with pytest.raises(ValueError, match="name one as twin="):
        load_local_task(other, twin="AmazonCounterfactualClassification")
    assert type(load_local_task(other, twin="")).__mro__[2].__name__ == "AbsTaskClassification"


def test_sickr_twin_evaluates_the_whole_corpus_like_mteb(tmp_path):
    # mteb's SICK-R "test" split is all of SICK (train + trial + test); a local copy keeps SICK's splits
    folder = make_sts(tmp_path, "sickr")
    (folder / "train.jsonl").write_text((folder / "test.jsonl").read_text())
    task = load_local_task(folder)
    assert type(task).__mro__[2].__name__ == "SickrSTS" and task.metadata.eval_splits == ["test"]
    task.load_data()
    assert len(task.dataset["test"]) == 22


@pytest.mark.parametrize(
    ("content", "fields", "message"),
    [
        ('{"text": "a", "label": 1}\n{"text": "b", "label": 2\n', ["text", "label"], ":2: invalid JSON"),
        ('{"text": "a", "label": 1}\n\n{"label": 2}\n', ["text", "label"], ":3: missing field 'text'"),
        (
            '{"sentence1": "a", "sentence2": "b", "score": "high"}\n',
            ["sentence1", "sentence2", "score"],
            ":1: field 'score'",
        ),
        ("[1, 2]\n", ["text"], ":1: expected a JSON object"),
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path, content, fields, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(LocalDataError, match="bad.jsonl" + message.replace("(", r"\(")):
        read_jsonl(path, fields)


def test_malformed_qrels_and_truncated_gzip(tmp_path):
    path = tmp_path / "test.tsv"
    path.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\n")
    with pytest.raises(LocalDataError, match=r"test.tsv:3: expected 3"):
        read_qrels(path)
    path.write_text("query-id\tcorpus-id\tscore\nq1\td1\tyes\n")
    with pytest.raises(LocalDataError, match=r"test.tsv:2: relevance score 'yes'"):
        read_qrels(path)
    gz = tmp_path / "corpus.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"_id": "1", "text": "x"}\n' * 50)[:30])
    with pytest.raises(LocalDataError, match="corpus.jsonl.gz"):
        read_jsonl(gz, ["_id", "text"])


def test_malformed_file_inside_a_task_is_reported_at_load(data_dir):
    path = data_dir / "sts" / "tinysts" / "test.jsonl"
    lines = path.read_text().splitlines()
    lines[4] = '{"sentence1": "x", "score": 1.0}'
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LocalDataError, match=r"tinysts/test.jsonl:5: missing field 'sentence2'"):
        _loaded(path.parent)


def test_missing_files_are_clear_errors(tmp_path):
    folder = make_classification(tmp_path, "nocls")
    (folder / "train.jsonl").unlink()
    with pytest.raises(LocalDataError, match="train.jsonl"):
        load_local_task(folder, kind="classification")
    ret = make_retrieval(tmp_path, "noqueries")
    (ret / "queries.jsonl").unlink()
    task = load_local_task(ret)
    with pytest.raises(LocalDataError, match="missing queries.jsonl"):
        task.load_data()
    with pytest.raises(LocalDataError, match="does not exist"):
        load_local_task(tmp_path / "nowhere")


# ------------------------------------------------------------------------------------------------------------
# Context pools


def test_retrieval_pool_is_the_corpus_never_the_queries(data_dir):
    task = _loaded(data_dir / "retrieval" / "tinyret")
    pool = context_pool(task, "default", "test")
    assert len(pool) == 12
    assert pool[0] == "Doc 0 apples are red fruit variant 0"  # title + text, as mteb feeds documents
    assert not any("QUERY-ONLY" in text for text in pool)


def test_classification_pool_is_the_train_texts(data_dir):
    task = _loaded(data_dir / "classification" / "tinycls")
    pool = context_pool(task, "default", "test")
    assert len(pool) == 16 and all(t.startswith("TRAIN") for t in pool)
    # the train-split encode call of mteb gets the same pool (and, below, the same context)
    assert context_pool(task, "default", "train") == pool


def test_own_text_pools_for_sts_pairs_and_clustering(data_dir):
    sts = _loaded(data_dir / "sts" / "tinysts")
    pool = context_pool(sts, "default", "test")
    rows = sts.dataset["test"]
    assert set(pool) == set(rows["sentence1"]) | set(rows["sentence2"])
    assert len(pool) == len(set(pool)) == 20  # both columns, the repeated pair counted once
    pair = _loaded(data_dir / "pair_classification" / "tinypair")
    rows = pair.dataset["test"]
    assert set(context_pool(pair, "default", "test")) == set(rows["sentence1"]) | set(rows["sentence2"])
    clu = _loaded(data_dir / "clustering" / "tinyclu")
    assert context_pool(clu, "default", "test") == [f"{TOPICS[i % 4]} item {i}" for i in range(12)]


def test_context_plan_is_seeded_and_chosen_once_per_task_subset_split(data_dir):
    ret = _loaded(data_dir / "retrieval" / "tinyret")
    cls = _loaded(data_dir / "classification" / "tinycls")
    plan = ContextPlan(mode="corpus", size=5, seed=3)
    plan.register(ret)
    plan.register(cls)
    choice = plan.choose("tinyret", "default", "test")
    assert choice.texts == sample_context(context_pool(ret, "default", "test"), 5, 3)
    assert plan.choose("tinyret", "default", "test") is choice
    assert len(set(choice.texts)) == 5  # without replacement
    assert plan.choose("tinycls", "default", "train") is plan.choose("tinycls", "default", "test")
    other_seed = ContextPlan(mode="corpus", size=5, seed=4)
    other_seed.register(ret)
    assert other_seed.choose("tinyret", "default", "test").texts != choice.texts
    assert ContextPlan(mode="none", size=5).choose("tinyret", "default", "test") is None
    assert ContextPlan(mode="corpus", size=0).choose("tinyret", "default", "test") is None
    with pytest.raises(KeyError, match="not registered"):
        plan.choose("unknown", "default", "test")
    with pytest.raises(ValueError, match="random_pool"):
        ContextPlan(mode="random", size=4)


# ------------------------------------------------------------------------------------------------------------
# Prefixes and the wrapper


def test_task_prefixes_by_type_and_overrides():
    p = TaskPrefixes()
    assert p.for_inputs("Retrieval", "query") == "search_query: "
    assert p.for_inputs("Reranking", "document") == "search_document: "
    assert p.for_context("Retrieval") == "search_document: "
    assert p.for_inputs("Classification", None) == p.for_context("Classification") == "classification: "
    assert p.for_inputs("Clustering", None) == "clustering: "
    assert p.for_inputs("STS", None) == "classification: "
    custom = p.with_overrides({"symmetric": "sts: ", "query": "q: "})
    assert custom.for_inputs("PairClassification", None) == "sts: " and custom.for_inputs("Retrieval", "query") == "q: "
    assert TaskPrefixes.off().for_inputs("Retrieval", "query") == ""
    with pytest.raises(ValueError, match="Unknown prefix role"):
        p.with_overrides({"passage": "x"})


class _RecordingModel:
    """Stands in for a SentenceTransformer: records which prompt each encode call used."""

    prompts = {"query": "Q: ", "document": ""}
    similarity_fn_name = "cosine"
    max_seq_length = 16

    def __init__(self):
        self.calls = []

    def _encode(self, kind, texts, prompt=None, **kwargs):
        self.calls.append((kind, prompt, list(texts)))
        return np.ones((len(texts), 4), dtype=np.float32)

    def encode(self, texts, **kw):
        return self._encode("encode", texts, **kw)

    def encode_query(self, texts, **kw):
        return self._encode("query", texts, **kw)

    def encode_document(self, texts, **kw):
        return self._encode("document", texts, **kw)

    def get_embedding_dimension(self):
        return 4


def test_wrapper_applies_prefixes_and_model_prompts(data_dir):
    from mteb.types import PromptType

    from cde_st.evaluation.wrapper import ContextualEncoderWrapper, build_model_meta

    task = _loaded(data_dir / "sts" / "tinysts")
    model = _RecordingModel()
    meta = build_model_meta(model, name="test/recording", revision="r", experiment_kwargs={"context": "none"})
    loader = [{"text": ["a", "b"]}]
    with_prefixes = ContextualEncoderWrapper(model, plan=None, prefixes=TaskPrefixes(), model_meta=meta)
    with_prefixes.encode(loader, task_metadata=task.metadata, hf_split="test", hf_subset="default")
    assert model.calls[-1] == ("encode", "classification: ", ["a", "b"])
    ret = _loaded(data_dir / "retrieval" / "tinyret")
    with_prefixes.encode(
        loader, task_metadata=ret.metadata, hf_split="test", hf_subset="default", prompt_type=PromptType.query
    )
    assert model.calls[-1][:2] == ("query", "search_query: ")
    # prefixes off: the model's own prompts, as mteb would choose them
    plain = ContextualEncoderWrapper(model, plan=None, prefixes=None, model_meta=meta)
    plain.encode(loader, task_metadata=ret.metadata, hf_split="test", hf_subset="default", prompt_type=PromptType.query)
    assert model.calls[-1][:2] == ("query", "Q: ")
    assert not plain.contextual
    # a model whose encode() applies a default prompt (cde_st: the document prompt) gets it named, so its
    # context documents get the same prefix
    model.prompts, model.default_prompt_name = {"query": "Q: ", "document": "D: "}, "document"
    plain.encode(loader, task_metadata=task.metadata, hf_split="test", hf_subset="default")
    assert model.calls[-1][:2] == ("encode", "D: ")
    assert plain._context_prompt(task.metadata) == "D: "


# ------------------------------------------------------------------------------------------------------------
# The runner, end to end


def test_unknown_task_and_missing_model_errors(data_dir, tmp_path):
    from cde_st.evaluation.runner import UnknownTaskError, load_model, resolve_task

    with pytest.raises(UnknownTaskError, match=r"Unknown task 'tinyrett'.*Did you mean: tinyret"):
        resolve_task("tinyrett", data_dir)
    with pytest.raises(UnknownTaskError, match="--data-dir"):
        resolve_task("no_such_task_anywhere", None)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "missing_model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a model folder"):
        load_model(tmp_path / "empty")


def test_hub_task_offline_gives_a_clear_error(data_dir, monkeypatch):
    import mteb

    from cde_st.evaluation.runner import TaskDataError, _load_task_data

    task = mteb.get_task("STS12")

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'mteb/sts12-sts' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(task, "load_data", offline)
    with pytest.raises(TaskDataError, match="STS12.*Hugging Face hub.*local folder"):
        _load_task_data(task, data_dir)


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

    spec = importlib.util.spec_from_file_location("run_mteb", Path(__file__).parents[1] / "eval" / "run_mteb.py")
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


# ------------------------------------------------------------------------------------------------------------
# Reports


def _score(task, task_type, value, size=0):
    return report.TaskScore(task, task_type, "m", "test", value, "corpus", size, 0)


def test_type_averages_and_sweep_outputs(tmp_path):
    scores = [
        _score("a", "Classification", 60.0),
        _score("b", "Classification", 70.0),
        _score("c", "Retrieval", 40.0),
        _score("d", "STS", 80.0),
    ]
    row = report.type_averages(scores)
    assert row["Class."] == 65.0 and row["Retrieval"] == 40.0 and row["STS"] == 80.0
    assert row["Clust."] is None and row["Avg"] == 62.5
    sweep = [_score("c", "Retrieval", v, j) for j, v in [(0, 40.0), (16, 42.0), (64, 45.0)]]
    table = report.sweep_markdown(sweep, "sweep")
    assert "| c | 40.00 | 42.00 | 45.00 |" in table
    png = report.plot_sweep(sweep, tmp_path / "sweep.png", "sweep")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------------------------
# Contextual models


def test_contextual_model_context_from_the_right_pool(data_dir, tmp_path, make_tiny_cde, monkeypatch):
    from cde_st.evaluation import evaluate_model, wrapper

    model = make_tiny_cde(context_size=8)
    seen = []
    original = wrapper._set_model_context

    def spy(model, texts, seed, prompt, batch_size=32):
        seen.append((list(texts), prompt))
        return original(model, texts, seed=seed, prompt=prompt, batch_size=batch_size)

    monkeypatch.setattr(wrapper, "_set_model_context", spy)
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
    ret = _loaded(data_dir / "retrieval" / "tinyret")
    cls = _loaded(data_dir / "classification" / "tinycls")
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
    sts, clu = _loaded(data_dir / "sts" / "tinysts"), _loaded(data_dir / "clustering" / "tinyclu")
    foreign, name = runner._random_pool([sts, clu], None, data_dir, max_size=8, seed=0)
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


def test_sweep_runs_never_see_each_others_context(data_dir, make_tiny_cde, monkeypatch):
    """Runs of a sweep share one model: each encode must see exactly its own run's context (J=0: none)."""
    from cde_st.evaluation import evaluate_model
    from cde_st.evaluation.wrapper import ContextualEncoderWrapper

    model = make_tiny_cde(context_size=8)
    seen = []
    original = ContextualEncoderWrapper._ensure_context

    def spy(self, task_metadata, hf_subset, hf_split):
        original(self, task_metadata, hf_subset, hf_split)
        info = model.context_info
        seen.append((self.plan.size, task_metadata.name, None if info is None else info.size))

    monkeypatch.setattr(ContextualEncoderWrapper, "_ensure_context", spy)
    evaluate_model(
        model,
        ["tinysts", "tinyclu", "tinypair"],
        data_dir=data_dir,
        output_dir=None,
        batch_size=8,
        context_size=[0, 8],
        show_progress_bar=False,
    )
    assert {task for _, task, _ in seen} == {"tinysts", "tinyclu", "tinypair"}
    assert all(info is None for size, _, info in seen if size == 0)
    assert all(info == 8 for size, _, info in seen if size == 8)


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


def test_full_and_partial_context_paths_agree(make_tiny_cde):
    """J = slots goes through set_context(texts), J < slots through first-stage vectors: same documents and
    prompt must give the same context either way."""
    from cde_st import contextual_module, set_context
    from cde_st.evaluation.wrapper import _set_model_context

    model = make_tiny_cde(context_size=8)
    docs = [f"{TOPICS[i % 4]} context {i}" for i in range(8)]
    probe = ["what falls from clouds?", "a cat"]
    info = _set_model_context(model, docs, seed=0, prompt="p: ")
    assert info.size == 8 and model.context_info is info
    full = model.encode(probe, prompt="")
    vectors = contextual_module(model).embed_context_texts(["p: " + d for d in docs])
    set_context(model, vectors)
    np.testing.assert_allclose(model.encode(probe, prompt=""), full, atol=1e-5)
    partial = _set_model_context(model, docs[:3], seed=0, prompt="p: ")
    assert partial.size == 3  # the other 5 slots hold the null vector
    assert not np.allclose(model.encode(probe, prompt=""), full, atol=1e-3)
    with pytest.raises(ValueError, match="exceeds the model's 8 context slots"):
        _set_model_context(model, docs + ["one more"], seed=0, prompt="")


# ------------------------------------------------------------------------------------------------------------
# Cached results (--no-overwrite) are reused only for the same data and context


def _result_json(out: Path, task: str) -> dict:
    (path,) = list((out / "results").rglob(f"{task}.json"))
    return json.loads(path.read_text())


def test_no_overwrite_reruns_when_the_local_data_changed(data_dir, tmp_path, tiny_bert_dir, caplog):
    """Issue: ``--no-overwrite`` returned the score of the old data after the folder changed (its fingerprint was
    recorded as the dataset revision but never compared)."""
    from cde_st.cli import eval_run

    def argv(out: Path) -> list[str]:
        return [
            *("--model", tiny_bert_dir, "--tasks", "tinyret", "--data-dir", str(data_dir)),
            *("--output-dir", str(out), "--batch-size", "8", "--quiet", "--model-name", "test/tiny"),
        ]

    out = tmp_path / "out"
    assert eval_run(argv(out)) == 0
    old = _result_json(out, "tinyret")
    # the relevance judgements change: every query now points at another document
    qrels = data_dir / "retrieval" / "tinyret" / "qrels" / "test.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{(i + 5) % 12}\t1\n" for i in range(6)))
    assert eval_run(argv(tmp_path / "fresh")) == 0
    fresh = _result_json(tmp_path / "fresh", "tinyret")
    assert fresh["dataset_revision"] != old["dataset_revision"]
    assert fresh["scores"]["test"][0]["ndcg_at_10"] != old["scores"]["test"][0]["ndcg_at_10"]  # the test can fail
    with caplog.at_level("WARNING", logger="cde_st.evaluation.runner"):
        assert eval_run([*argv(out), "--no-overwrite"]) == 0
    stale = _result_json(out, "tinyret")
    assert stale["dataset_revision"] == fresh["dataset_revision"]
    assert stale["scores"]["test"][0]["ndcg_at_10"] == pytest.approx(fresh["scores"]["test"][0]["ndcg_at_10"])
    assert any("tinyret" in r.getMessage() and "re-running" in r.getMessage() for r in caplog.records)


def test_no_overwrite_reuses_only_matching_data_and_context(data_dir, tmp_path, make_tiny_cde, monkeypatch):
    """Same data and settings: the cached result is reused (nothing encoded). A changed context (here: the
    content of the fixed random corpus, whose file name stays the same) re-runs."""
    from cde_st.evaluation import evaluate_model

    model = make_tiny_cde(context_size=8)
    corpus = tmp_path / "foreign.txt"
    corpus.write_text("\n".join(f"foreign document {i} about {TOPICS[i % 4]}" for i in range(20)) + "\n")
    kwargs = dict(
        data_dir=data_dir,
        output_dir=tmp_path / "out",
        batch_size=8,
        context="random",
        random_corpus=corpus,
        context_size=4,
        show_progress_bar=False,
        model_name="test/tiny-cde",
    )
    first = evaluate_model(model, ["tinysts"], **kwargs)
    assert first.runs[0].cache_notes == {}
    encoded = []
    original = type(model).encode

    def spy(self, *args, **kw):
        encoded.append(1)
        return original(self, *args, **kw)

    monkeypatch.setattr(type(model), "encode", spy)
    again = evaluate_model(model, ["tinysts"], overwrite=False, **kwargs)
    assert encoded == [] and again.score("tinysts") == pytest.approx(first.score("tinysts"), abs=1e-3)  # stored rounded
    assert "reused" in again.runs[0].cache_notes["tinysts"]
    corpus.write_text("\n".join(f"another text {i} on {TOPICS[(i + 1) % 4]}" for i in range(20)) + "\n")
    changed = evaluate_model(model, ["tinysts"], overwrite=False, **kwargs)
    assert encoded and "re-ran" in changed.runs[0].cache_notes["tinysts"]
    assert "context" in changed.runs[0].cache_notes["tinysts"]
    fresh = evaluate_model(model, ["tinysts"], **{**kwargs, "output_dir": None})
    assert changed.score("tinysts") == pytest.approx(fresh.score("tinysts"))


# ------------------------------------------------------------------------------------------------------------
# Relevance judgements that point at documents / queries the task does not have


def _rewrite_qrels(folder: Path, pairs: list[tuple[str, str]]) -> None:
    lines = "".join(f"{q}\t{d}\t1\n" for q, d in pairs)
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + lines)


@pytest.mark.parametrize("n_missing", [6, 4])  # all, and a large share, of the 6 judgements
def test_qrels_pointing_at_missing_documents_fail_at_load(data_dir, n_missing):
    """Issue: qrels whose documents are not in the corpus were scored without a word (NDCG@10 0.00 when all
    were missing)."""
    folder = data_dir / "retrieval" / "tinyret"
    _rewrite_qrels(folder, [(f"q{i}", f"doc-{i}" if i < n_missing else f"d{i}") for i in range(6)])
    task = load_local_task(folder)
    with pytest.raises(LocalDataError) as err:
        task.load_data()
    message = str(err.value)
    assert "tinyret" in message and "qrels/test.tsv" in message and "corpus.jsonl.gz" in message
    assert f"{n_missing} of 6" in message and "doc-0" in message and "doc-1" in message


def test_qrels_with_some_missing_documents_warn_with_the_count(data_dir, caplog):
    folder = data_dir / "retrieval" / "tinyret"
    _rewrite_qrels(folder, [(f"q{i}", f"d{i}") for i in range(6)] + [("q0", "gone-7")])
    task = load_local_task(folder)
    with caplog.at_level("WARNING", logger="cde_st.evaluation.local_tasks"):
        task.load_data()
    (record,) = [r for r in caplog.records if "gone-7" in r.getMessage()]
    assert "1 of 7" in record.getMessage() and "qrels/test.tsv" in record.getMessage()
    assert task.dataset["default"]["test"]["relevant_docs"]["q0"] == {"d0": 1, "gone-7": 1}


def test_qrels_with_unknown_query_ids(data_dir, caplog):
    folder = data_dir / "retrieval" / "tinyret"
    _rewrite_qrels(folder, [(f"q{i}" if i < 2 else f"other-q{i}", f"d{i}") for i in range(6)])
    with pytest.raises(LocalDataError, match=r"qrels/test.tsv.*4 of 6 .*query ids.*queries.jsonl.*other-q2"):
        load_local_task(folder).load_data()
    _rewrite_qrels(folder, [(f"q{i}" if i else "lost-q0", f"d{i}") for i in range(6)])
    task = load_local_task(folder)
    with caplog.at_level("WARNING", logger="cde_st.evaluation.local_tasks"):
        task.load_data()
    assert any("1 of 6" in r.getMessage() and "lost-q0" in r.getMessage() for r in caplog.records)
    assert "lost-q0" not in task.dataset["default"]["test"]["relevant_docs"]  # not scored


def test_hub_retrieval_data_with_missing_documents_fails(monkeypatch):
    """The same check for mteb's own (hub) retrieval tasks, after mteb loaded them."""
    import mteb
    from datasets import Dataset

    from cde_st.evaluation.runner import _load_task_data

    task = mteb.get_task("SciFact")

    def load(**kwargs):
        corpus = Dataset.from_dict({"id": ["1", "2"], "title": ["", ""], "text": ["a", "b"]})
        queries = Dataset.from_dict({"id": ["q1", "q2"], "text": ["x", "y"]})
        relevant = {"q1": {"101": 1}, "q2": {"102": 1}}
        task.dataset = {"default": {"test": {"corpus": corpus, "queries": queries, "relevant_docs": relevant}}}
        task.data_loaded = True

    monkeypatch.setattr(task, "load_data", load)
    with pytest.raises(LocalDataError, match=r"SciFact.*test.*2 of 2.*'101'"):
        _load_task_data(task, None)


# ------------------------------------------------------------------------------------------------------------
# Queries that are also corpus documents (ArguAna / Quora-like): identical ids


def make_self_retrieval(root: Path, name: str) -> Path:
    """A BEIR folder whose queries are also corpus documents (same id, same text), as in ArguAna or Quora: a
    query must not be credited for (or penalised by) retrieving itself."""
    folder = root / "retrieval" / name
    queries = [{"_id": f"a{i}", "text": f"argument about {TOPICS[i % 4]} number {i}"} for i in range(6)]
    others = [{"_id": f"d{i}", "title": "", "text": f"counter to {TOPICS[i % 4]} {i}"} for i in range(6)]
    _write_jsonl(folder / "corpus.jsonl", [{**q, "title": ""} for q in queries] + others)
    _write_jsonl(folder / "queries.jsonl", queries)
    (folder / "qrels").mkdir()
    (folder / "qrels" / "test.tsv").write_text("".join(f"a{i}\td{i}\t1\n" for i in range(6)))
    return folder


@pytest.mark.parametrize(
    ("folder", "twin", "ignore"),
    [("arguana", "ArguAna", True), ("QUORA", "QuoraRetrieval", True), ("scidocs", "SCIDOCS", False)],
)
def test_local_folder_named_after_any_mteb_task_takes_its_settings(tmp_path, folder, twin, ignore):
    """Issue: only the shared folder names were recognised; a local ArguAna copy was scored as a generic
    retrieval task (each query retrieving itself). Names come from mteb's registry: task name or dataset name,
    any case."""
    task = load_local_task(make_self_retrieval(tmp_path, folder))
    assert task.metadata.adapted_from == [twin] and task.metadata.name == folder
    assert twin.lower() in {c.__name__.lower() for c in type(task).__mro__} or any(
        getattr(c, "metadata", None) is not None and c.metadata.name == twin for c in type(task).__mro__[1:]
    )
    assert task.ignore_identical_ids is ignore
    assert f"mteb task {twin}" in task.identical_ids_rule


def test_generic_folder_whose_queries_are_corpus_documents_ignores_identical_ids(data_dir, tmp_path, tiny_plain_model, caplog):
    from cde_st.evaluation import evaluate_model

    make_self_retrieval(data_dir, "my_arguments")
    kwargs = dict(data_dir=data_dir, output_dir=tmp_path / "out", batch_size=8, show_progress_bar=False)
    with caplog.at_level("WARNING", logger="cde_st.evaluation.local_tasks"):
        auto = evaluate_model(tiny_plain_model, ["my_arguments", "tinyret"], **kwargs)
    rule = auto.task_settings["my_arguments"]["identical_ids"]
    assert rule.startswith("ignore") and "6 of 6 query ids are also corpus ids" in rule
    assert "the queries are corpus documents" in rule  # decided from the texts, and says so
    assert any("my_arguments" in r.getMessage() and "identical" in r.getMessage() for r in caplog.records)
    assert auto.task_settings["tinyret"]["identical_ids"].startswith("keep")  # no overlap: nothing to ignore
    assert "my_arguments" in auto.files["summary_md"].read_text() and rule in auto.files["summary_md"].read_text()
    ignore = evaluate_model(
        tiny_plain_model, ["my_arguments"], identical_ids="ignore", **{**kwargs, "output_dir": None}
    )
    keep = evaluate_model(tiny_plain_model, ["my_arguments"], identical_ids="keep", **{**kwargs, "output_dir": None})
    assert auto.score("my_arguments") == pytest.approx(ignore.score("my_arguments"))
    assert keep.score("my_arguments") < auto.score("my_arguments")  # each query found itself first
    assert keep.task_settings["my_arguments"]["identical_ids"].startswith("keep")
    # the option overrides an mteb twin's own setting too, and the command line has it
    assert not load_local_task(make_self_retrieval(tmp_path, "arguana"), identical_ids="keep").ignore_identical_ids
    from cde_st.cli import _eval_parser

    args = _eval_parser().parse_args(["--model", "m", "--tasks", "t", "--identical-ids", "keep"])
    assert args.identical_ids == "keep"


# ------------------------------------------------------------------------------------------------------------
# mteb used directly: a contextual model's results must be keyed by its context


def test_mteb_direct_results_are_keyed_by_the_context(data_dir, tmp_path, make_tiny_cde):
    """Issue: mteb stores a local model's results under ``no_model_name/available``, so after ``set_context`` a
    second ``mteb.evaluate`` returned the old score without encoding. ``mteb_model_meta`` gives a name/revision that
    includes the context fingerprint; set on the model card, two contexts never collide (the README snippet)."""
    import mteb

    from cde_st import set_context
    from cde_st.evaluation import mteb_model_meta

    model = make_tiny_cde(context_size=4)
    task = load_local_task(data_dir / "sts" / "tinysts")
    docs_a = [f"{TOPICS[i % 4]} context a{i}" for i in range(4)]
    docs_b = [f"something else entirely {i}" for i in range(4)]

    def score(cache) -> float:
        result = mteb.evaluate(model, task, cache=cache, show_progress_bar=False, co2_tracker=False)
        return result.task_results[0].scores["test"][0]["cosine_pearson"]  # spearman: too few pairs to move

    # what mteb does on its own: both contexts share one cache entry, the second score is the first one
    naive = mteb.ResultCache(cache_path=str(tmp_path / "naive"))
    set_context(model, docs_a)
    first = score(naive)
    set_context(model, docs_b)
    assert score(naive) == pytest.approx(first, abs=2e-6)  # cached (stored rounded), nothing encoded
    assert score(None) != pytest.approx(first, abs=1e-5)  # what context b really scores
    assert [p.parts[-3:-1] for p in (tmp_path / "naive").rglob("tinysts.json")] == [
        ("no_model_name__available", "no_revision_available")
    ]

    cache = mteb.ResultCache(cache_path=str(tmp_path / "keyed"))
    scores = {}
    for name, docs in (("a", docs_a), ("b", docs_b)):
        info = set_context(model, docs)
        meta = mteb_model_meta(model, name="test/tiny-cde")
        assert info.fingerprint in meta.revision and meta.name == "test/tiny-cde"
        model.model_card_data.model_name = meta.name
        model.model_card_data.base_model_revision = meta.revision
        scores[name] = score(cache)
        assert scores[name] == pytest.approx(score(None), abs=2e-6)  # not a cached score of the other context
    assert scores["a"] != pytest.approx(scores["b"], abs=1e-5)
    assert len(list((tmp_path / "keyed").rglob("tinysts.json"))) == 2
    model.clear_context()
    assert mteb_model_meta(model, name="test/tiny-cde").revision.endswith("ctx-none")
    assert mteb_model_meta(model).name == "test/tiny-cde"  # default: the model card name


def make_numbered_collection(root: Path, name: str = "classic") -> Path:
    """A classic test collection (MED / CACM style): queries and documents both numbered 1..N with unrelated texts,
    and query i judged relevant to document i."""
    folder = root / "retrieval" / name
    corpus = [{"_id": str(i), "title": "", "text": f"{TOPICS[i % 4]} report number {i}"} for i in range(1, 13)]
    queries = [{"_id": str(i), "text": f"what is known about {TOPICS[i % 4]}"} for i in range(1, 7)]
    _write_jsonl(folder / "corpus.jsonl", corpus)
    _write_jsonl(folder / "queries.jsonl", queries)
    (folder / "qrels").mkdir()
    (folder / "qrels" / "test.tsv").write_text("".join(f"{i}\t{i}\t1\n" for i in range(1, 7)))
    return folder


def test_ids_that_merely_coincide_keep_the_query_own_document(tmp_path, tiny_plain_model):
    """Issue 24: a folder numbering queries and documents 1..N got BEIR's rule, so document 7, judged relevant to
    query 7, was removed from query 7's results. auto decides from the texts and says why."""
    from cde_st.evaluation import evaluate_model

    folder = make_numbered_collection(tmp_path)
    task = _loaded(folder)
    assert task.ignore_identical_ids is False
    assert task.identical_ids_rule.startswith("keep") and "the ids coincide, the texts differ" in task.identical_ids_rule
    assert "6 of 6 query ids are also corpus ids" in task.identical_ids_rule
    kwargs = dict(output_dir=None, batch_size=8, show_progress_bar=False)
    auto = evaluate_model(tiny_plain_model, [folder], **kwargs)
    ignore = evaluate_model(tiny_plain_model, [folder], identical_ids="ignore", **kwargs)
    assert auto.score("classic") > 0 and ignore.score("classic") == 0  # every relevant document was removed
    assert "the ids coincide" in auto.task_settings["classic"]["identical_ids"]
    assert ignore.task_settings["classic"]["identical_ids"].startswith("ignore")


def test_queries_are_documents_rule():
    from cde_st.evaluation.local_tasks import queries_are_documents

    docs = {"1": "Title  The Cat sat", "2": "other", "3": "third doc"}
    assert queries_are_documents({"1": "the cat SAT", "2": "other"}, docs)[0] is True
    assert queries_are_documents({"1": "dogs", "2": "birds", "3": "third doc"}, docs)[0] is False  # 1 of 3
    ignore, why = queries_are_documents({"9": "x"}, docs)
    assert ignore is False and "no query id is also a corpus id" in why


@pytest.mark.slow
@pytest.mark.parametrize("name", ["med", "cacm", "lisa"])
def test_classic_collections_keep_identical_ids(shared_data, name):
    task = _loaded(shared_data / "retrieval" / name)
    assert task.ignore_identical_ids is False, task.identical_ids_rule
    assert "the ids coincide, the texts differ" in task.identical_ids_rule


# ------------------------------------------------------------------------------------------------------------
# Inputs taken as written (issue 24): nothing silently coerced or dropped


def _qrels(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "test.tsv"
    path.write_text(text)
    return path


def test_fractional_or_infinite_grades_are_errors_naming_file_and_line(tmp_path):
    with pytest.raises(LocalDataError, match=r"test.tsv:3: relevance score '0.5' is fractional"):
        read_qrels(_qrels(tmp_path, "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0.5\n"))
    with pytest.raises(LocalDataError, match=r"test.tsv:2: relevance score 'inf' is not a finite number"):
        read_qrels(_qrels(tmp_path, "q1\td1\t1\nq1\td2\tinf\n"))
    assert read_qrels(_qrels(tmp_path, "q1\td1\t2.0\n")) == {"q1": {"d1": 2}}  # an integral float is its integer


def test_duplicate_judgements(tmp_path, caplog):
    with pytest.raises(LocalDataError, match=r"test.tsv:4: query 'q1', document 'd1' is judged 2 here and 1 at line 2"):
        read_qrels(_qrels(tmp_path, "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td1\t1\nq1\td1\t2\n"))
    with caplog.at_level("WARNING", logger="cde_st.evaluation.local_tasks"):
        assert read_qrels(_qrels(tmp_path, "q1\td1\t1\nq1\td1\t1\n")) == {"q1": {"d1": 1}}
    assert "repeated with the same grade" in caplog.text


def test_only_the_beir_header_is_skipped(tmp_path):
    with pytest.raises(LocalDataError, match=r"test.tsv:1: relevance score 'relevance' is not a number"):
        read_qrels(_qrels(tmp_path, "qid\tdocid\trelevance\nq1\td1\t1\n"))
    with pytest.raises(LocalDataError, match=r"test.tsv:1: relevance score 'x' is not a number"):
        read_qrels(_qrels(tmp_path, "q0\td0\tx\nq1\td1\t1\n"))  # a broken first judgement is not a header
    assert read_qrels(_qrels(tmp_path, "query-id\tcorpus-id\tscore\nq1\td1\t1\n")) == {"q1": {"d1": 1}}


def test_queries_judged_only_non_relevant_are_left_out_with_a_warning(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="cde_st.evaluation.local_tasks"):
        qrels = read_qrels(_qrels(tmp_path, "q1\td1\t1\nq2\td1\t0\nq2\td2\t-1\n"))
    assert qrels == {"q1": {"d1": 1}}
    assert "1 of 2 judged queries have no document graded above 0" in caplog.text and "'q2'" in caplog.text
    with pytest.raises(LocalDataError, match="no judgement has a grade above 0"):
        read_qrels(_qrels(tmp_path, "q1\td1\t0\n"))


def test_duplicate_corpus_ids_with_other_texts_fail_naming_both_lines(tmp_path):
    folder = make_retrieval(tmp_path)
    path = folder / "corpus.jsonl.gz"
    rows = [json.loads(line) for line in gzip.open(path, "rt")]
    _write_jsonl(path, [*rows, {"_id": "d3", "title": "Doc 3", "text": "a different text"}])
    with pytest.raises(LocalDataError, match=r"corpus.jsonl.gz:13: _id 'd3' is also at line 4 with another text"):
        _loaded(folder)
    _write_jsonl(path, [*rows, dict(rows[3])])  # an exact repeat is read once
    assert len(_loaded(folder).dataset["default"]["test"]["corpus"]) == 12


@pytest.mark.parametrize(
    ("make", "file", "rows", "message"),
    [
        (make_sts, "test.jsonl", [{"sentence1": "a", "sentence2": "b", "score": 3.0}], "at least two pairs"),
        (
            make_sts,
            "test.jsonl",
            [{"sentence1": "a", "sentence2": "b", "score": 3.0}, {"sentence1": "c", "sentence2": "d", "score": 3.0}],
            "every pair has the score 3.0",
        ),
        (make_classification, "train.jsonl", [{"text": f"t{i}", "label": "a"} for i in range(4)], "label 'a'"),
        (make_clustering, "test.jsonl", [{"text": f"t{i}", "label": 1} for i in range(4)], "one cluster"),
        (
            make_pairs,
            "test.jsonl",
            [{"sentence1": f"a{i}", "sentence2": f"b{i}", "label": 1} for i in range(3)],
            "every pair has label 1",
        ),
    ],
)
def test_data_that_cannot_be_scored_names_the_file_and_why(tmp_path, make, file, rows, message):
    """Issue 24: one-label classification or one-pair STS data gave mteb errors (or nan) naming neither."""
    folder = make(tmp_path)
    _write_jsonl(folder / file, rows)
    with pytest.raises(LocalDataError, match=f"{folder.name}/{file}: .*{message}"):
        _loaded(folder)


def test_random_corpus_and_context_seed_errors_name_the_option(data_dir, tmp_path, tiny_plain_model, capsys):
    """Issue 24: a missing --random-corpus file was reported as an unknown task; --context-seed -1 as a numpy
    error naming no option."""
    with pytest.raises(FileNotFoundError, match=r"random_corpus \(--random-corpus\) '.*missing.jsonl': no such file"):
        runner.load_text_corpus(str(tmp_path / "missing.jsonl"), data_dir)
    with pytest.raises(runner.UnknownTaskError, match=r"random_corpus \(--random-corpus\) 'nosuchtask'"):
        runner.load_text_corpus("nosuchtask", data_dir)
    with pytest.raises(ValueError, match=r"context_seed \(--context-seed\) must be an integer in \[0, 2\*\*32\)"):
        runner.evaluate_model(tiny_plain_model, ["tinyret"], data_dir=data_dir, context_seed=-1, output_dir=None)
    from cde_st.cli import eval_run

    assert eval_run(["--model", str(tmp_path), "--tasks", "tinyret", "--context-seed", "-1"]) == 2
    assert "--context-seed" in capsys.readouterr().err


def test_cli_output_lands_in_one_ignored_folder_and_faiss_loader_is_quiet(tmp_path):
    """Issue 23: results went to ./mteb_results (untracked, beside an mteb_cache/), and faiss's "Could not load
    library with AVX512 support" INFO lines read like errors."""
    import logging
    import subprocess

    from cde_st.cli import _eval_parser, eval_run

    args = _eval_parser().parse_args(["--model", "m", "--tasks", "t"])
    assert args.output_dir == runner.DEFAULT_OUTPUT_DIR == "outputs/mteb"
    repo = Path(__file__).resolve().parents[1]
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
    """Issue 23: FutureWarnings on every evaluation read as errors. The ones seen come from mteb building a ModelMeta
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
