"""In-training evaluators: a contextual model is always scored with a corpus context, never silently the null one."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from sentence_transformers.sentence_transformer.evaluation import (
    BinaryClassificationEvaluator,
    EmbeddingSimilarityEvaluator,
    InformationRetrievalEvaluator,
    SequentialEvaluator,
)

from cde_st.context import sample_context
from cde_st.evaluation.evaluators import (
    ContextualEvaluator,
    ContextualRetrievalEvaluator,
    corpus_context,
    with_corpus_context,
)

TOPICS = ["rain", "stocks", "proteins", "glaciers", "courts", "coffee", "music", "networks"]


@pytest.fixture
def beir(tmp_path):
    folder = tmp_path / "toy"
    (folder / "qrels").mkdir(parents=True)
    docs = [{"_id": f"d{i}", "title": "", "text": f"passage {i} on {TOPICS[i % 8]}"} for i in range(12)]
    queries = [{"_id": f"q{i}", "text": f"what about {TOPICS[i]}"} for i in range(6)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    qrels = "".join(f"q{i}\td{i}\t1\n" for i in range(6))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    return folder


def _stock(evaluator: ContextualRetrievalEvaluator) -> InformationRetrievalEvaluator:
    corpus = dict(zip(evaluator.corpus_ids, evaluator.corpus))
    queries = dict(zip(evaluator.queries_ids, evaluator.queries))
    return InformationRetrievalEvaluator(queries, corpus, evaluator.relevant_docs, name=evaluator.name)


def test_context_size_samples_that_many_corpus_documents(beir, make_tiny_cde):
    model = make_tiny_cde(context_size=8)
    evaluator = ContextualRetrievalEvaluator(beir, context_size=3, seed=5)
    scores = evaluator(model)
    # The same numbers as setting the 3 seeded documents (with the document prompt) by hand.
    texts = sample_context(evaluator.corpus, 3, seed=5)
    module = model.contextual_module
    model.set_context(module.embed_context_texts([model.prompts["document"] + t for t in texts]))
    expected = _stock(evaluator)(model)
    assert scores == pytest.approx(expected)
    model.clear_context()
    assert evaluator.get_config_dict()["context_size"] == 3
    with pytest.raises(ValueError, match="context_size=9 must be between 0 and the model's 8 context slots"):
        ContextualRetrievalEvaluator(beir, context_size=9)(model)
    with pytest.raises(ValueError, match="context_size must be >= 0"):
        ContextualRetrievalEvaluator(beir, context_size=-1)


def test_context_size_none_is_the_models_j_and_the_previous_context_comes_back(beir, make_tiny_cde):
    model = make_tiny_cde(context_size=4)
    model.set_context(["a passage about rain", "a note on coffee"])
    before_info = model.context_info
    before = model.encode_document(["passage 1 on stocks"])
    evaluator = ContextualRetrievalEvaluator(beir, seed=1)
    scores = evaluator(model)
    model2 = make_tiny_cde(context_size=4)
    model2.set_context(evaluator.corpus, seed=1)
    assert scores == pytest.approx(_stock(evaluator)(model2))
    assert model.context_info == before_info
    np.testing.assert_allclose(model.encode_document(["passage 1 on stocks"]), before, atol=1e-6)
    with corpus_context(model, evaluator.corpus, context_size=2, seed=0) as info:
        assert (info.size, info.seed, info.corpus_size) == (2, 0, 12)
    assert model.context_info == before_info


def test_stock_evaluators_are_wrapped_or_refused_for_contextual_models(beir, make_tiny_cde, tiny_bert_dir, caplog):
    model = make_tiny_cde(context_size=4)
    stock = _stock(ContextualRetrievalEvaluator(beir))
    with caplog.at_level(logging.WARNING, logger="cde_st.evaluation.evaluators"):
        wrapped = with_corpus_context(stock, model, seed=0)
    assert "null context" in caplog.text and "ContextualRetrievalEvaluator" in caplog.text
    assert isinstance(wrapped, ContextualEvaluator) and wrapped.evaluator is stock
    scores = wrapped(model)
    assert wrapped.primary_metric == stock.primary_metric and wrapped.primary_metric in scores
    assert model.context_info is None  # restored
    model.set_context(stock.corpus, seed=0)
    assert scores == pytest.approx(stock(model))
    model.clear_context()

    sts = EmbeddingSimilarityEvaluator(["a", "b"], ["c", "d"], [0.1, 0.9])
    with pytest.raises(TypeError, match="EmbeddingSimilarityEvaluator would score the contextual model with the null"):
        with_corpus_context(sts, model)
    with pytest.raises(TypeError, match="EmbeddingSimilarityEvaluator"):
        with_corpus_context(SequentialEvaluator([stock, sts]), model)
    sequential = with_corpus_context(SequentialEvaluator([stock]), model)
    assert isinstance(sequential.evaluators[0], ContextualEvaluator)
    contextual = ContextualRetrievalEvaluator(beir)
    assert with_corpus_context(contextual, model) is contextual
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    plain = SentenceTransformer(modules=[Transformer(tiny_bert_dir), Pooling(32)])
    assert with_corpus_context(sts, plain) is sts  # nothing to guard for plain models


@pytest.mark.slow
def test_train_scores_a_stock_evaluator_with_the_corpus_context(tmp_path, minilm):
    from cde_st import contextual_module
    from cde_st.training import TrainConfig, train

    seen = []

    class Spy(InformationRetrievalEvaluator):
        def __call__(self, model, *args, **kwargs):
            seen.append(contextual_module(model).context_info)
            return super().__call__(model, *args, **kwargs)

    docs = {f"d{i}": f"a passage number {i} explaining {TOPICS[i % 8]}" for i in range(16)}
    queries = {f"q{i}": f"question {i} about {TOPICS[i % 8]}" for i in range(8)}
    spy = Spy(queries, docs, {f"q{i}": {f"d{i}"} for i in range(8)}, name="spy")
    cfg = TrainConfig.from_preset(
        "tiny", output_dir=str(tmp_path / "run"), batching="random", filter_false_negatives=False, eval_steps=2
    )
    train(cfg, evaluator=spy)
    assert len(seen) >= 2 and all(info is not None and info.size == 8 for info in seen)
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert "spy_cosine_ndcg@10" in summary["final_eval"]
    with pytest.raises(ValueError, match="eval_folder.*evaluator"):
        train(
            TrainConfig.from_preset("tiny", output_dir=str(tmp_path / "both"), eval_folder=str(tmp_path)),
            evaluator=spy,
        )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: EmbeddingSimilarityEvaluator(["a"], ["b"], [0.5], name="one"), "1 pair\\(s\\); a Spearman"),
        (
            lambda: EmbeddingSimilarityEvaluator(["a", "c"], ["b", "d"], [1.0, 1.0], name="flat"),
            "every pair has the score",
        ),
        (
            lambda: EmbeddingSimilarityEvaluator(
                ["a", "c", "e"], ["b", "d", "f"], [1.0, float("nan"), 0.0], name="nan"
            ),
            "pair 1 has the gold score nan",
        ),
        (
            lambda: BinaryClassificationEvaluator(["a", "c"], ["b", "d"], [1, 1], name="pos"),
            "every pair has the label 1",
        ),
    ],
)
def test_evaluator_data_that_cannot_be_scored_is_refused(make, message):
    """a one-pair STS or one-label pair evaluator scored nan (and checkpoints were picked on it)."""
    evaluator = make()
    with pytest.raises(ValueError, match=f"{type(evaluator).__name__} '{evaluator.name}': {message}"):
        ContextualEvaluator(evaluator, corpus=["some text"])


def test_evaluator_and_eval_kit_sample_the_same_context(make_tiny_cde, tmp_path):
    """The in-training evaluator and cde-st-eval's context plan take the same J documents from the same corpus,
    repeated and blank documents included (the corpus is a set of documents for both)."""
    from evaluation_helpers import loaded, write_jsonl

    from cde_st.evaluation.pools import ContextPlan

    folder = tmp_path / "retrieval" / "dups"
    texts = [f"passage {i} on {TOPICS[i % 8]}" for i in range(10)]
    corpus = [{"_id": f"d{i}", "title": "", "text": t} for i, t in enumerate(texts)]
    corpus += [{"_id": f"r{i}", "title": "", "text": texts[i % 3]} for i in range(12)]  # the same texts again
    corpus += [{"_id": "blank", "title": "", "text": "  "}]
    write_jsonl(folder / "corpus.jsonl", corpus)
    write_jsonl(folder / "queries.jsonl", [{"_id": f"q{i}", "text": f"what about {TOPICS[i]}"} for i in range(3)])
    (folder / "qrels").mkdir()
    (folder / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(3))
    )

    model = make_tiny_cde(context_size=4)
    module = model.contextual_module
    seen = []
    evaluator = ContextualRetrievalEvaluator(folder, seed=3)
    with corpus_context(model, evaluator.corpus, seed=3):
        seen.append(list(module.active_context.texts))
    task = loaded(folder)
    plan = ContextPlan(size=4, seed=3)
    plan.register(task)
    choice = plan.choose(task.metadata.name, "default", "test")
    prompt = model.prompts.get("document", "")
    assert seen[0] == [prompt + t for t in choice.texts]


def test_contextual_evaluator_takes_the_texts_of_a_mapping():
    sts = EmbeddingSimilarityEvaluator(["a b", "c d"], ["a c", "b d"], [0.1, 0.9])
    evaluator = ContextualEvaluator(sts, corpus={"id1": "rain falls", "id2": "stocks fell"}, context_size=2)
    assert evaluator.corpus == ["rain falls", "stocks fell"]
