"""NDCG@k without mteb, beir or pytrec_eval: the same numbers as pytrec_eval and as the evaluation kit."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from cde_st.evaluation.ndcg import ndcg_at_k, score_beir_folder

TOPICS = ["rain and clouds", "stock markets", "protein folding", "glacier melt", "court rulings", "coffee farming"]


def make_folder(root: Path, name: str = "toyndcg", shared_ids: bool = False) -> Path:
    """A BEIR folder with a duplicated document (tied scores) and, optionally, query ids that are corpus ids."""
    folder = root / name
    (folder / "qrels").mkdir(parents=True)
    docs = [
        {"_id": f"d{i}", "title": "" if i % 3 else f"Note {i}", "text": f"{TOPICS[i % 6]} item {i}"} for i in range(30)
    ]
    docs.append({"_id": "d30", "title": docs[4]["title"], "text": docs[4]["text"]})  # a duplicate of d4
    prefix = "d" if shared_ids else "q"
    queries = [{"_id": f"{prefix}{i}", "text": f"news about {TOPICS[i % 6]}"} for i in range(7)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    qrels = [f"{prefix}{i}\td{i + 6 * k}\t{1 + k % 2}" for i in range(7) for k in range(2)] + [f"{prefix}4\td30\t1"]
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(qrels) + "\n")
    return folder


def test_hand_computed_ranking_with_graded_judgements():
    queries = torch.tensor([[1.0, 0.0]])
    documents = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])  # ranked a, b, c
    mean, per_query = ndcg_at_k(queries, documents, ["q"], ["a", "b", "c"], {"q": {"b": 2, "c": 1, "a": 0}}, k=2)
    dcg = 0 / math.log2(2) + 2 / math.log2(3)
    ideal = 2 / math.log2(2) + 1 / math.log2(3)
    assert mean == pytest.approx(dcg / ideal) and per_query == {"q": pytest.approx(dcg / ideal)}


def test_ties_are_ranked_by_document_id_descending_as_trec_eval_does():
    queries = torch.tensor([[1.0, 0.0]])
    documents = torch.tensor([[1.0, 0.0], [1.0, 0.0]])  # "a" and "b" tie
    assert ndcg_at_k(queries, documents, ["q"], ["a", "b"], {"q": {"b": 1}}, k=1)[0] == 1.0
    assert ndcg_at_k(queries, documents, ["q"], ["a", "b"], {"q": {"a": 1}}, k=1)[0] == 0.0


def test_identical_ids_are_dropped_only_when_asked():
    queries = torch.tensor([[1.0, 0.0]])
    documents = torch.tensor([[1.0, 0.0], [0.9, 0.1]])
    qrels = {"x": {"y": 1}}
    assert ndcg_at_k(queries, documents, ["x"], ["x", "y"], qrels, k=1, ignore_identical_ids=True)[0] == 1.0
    assert ndcg_at_k(queries, documents, ["x"], ["x", "y"], qrels, k=1, ignore_identical_ids=False)[0] == 0.0


def test_unjudged_queries_are_not_scored_and_mismatched_ids_raise():
    queries, documents = torch.eye(2), torch.eye(2)
    mean, per_query = ndcg_at_k(queries, documents, ["q1", "q2"], ["a", "b"], {"q1": {"a": 1}})
    assert set(per_query) == {"q1"} and mean == 1.0
    with pytest.raises(ValueError, match="one id per row"):
        ndcg_at_k(queries, documents, ["q1"], ["a", "b"], {"q1": {"a": 1}})


@pytest.mark.parametrize("ignore", [False, True])
def test_random_rankings_match_pytrec_eval(ignore):
    pytrec_eval = pytest.importorskip("pytrec_eval", reason="pytrec_eval is not installed")
    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(40, 16, generator=generator)
    documents = torch.randn(300, 16, generator=generator)
    documents[250:] = documents[:50]  # 50 duplicated documents: tied scores
    query_ids = [str(i) for i in range(40)]  # ids "0".."39" are also document ids
    document_ids = [str(i) for i in range(300)]
    qrels = {q: {str((7 * i + j * 13) % 300): 1 + j % 3 for j in range(4)} for i, q in enumerate(query_ids[:35])}
    mean, per_query = ndcg_at_k(queries, documents, query_ids, document_ids, qrels, ignore_identical_ids=ignore)
    scores = torch.nn.functional.normalize(queries, dim=-1) @ torch.nn.functional.normalize(documents, dim=-1).T
    run = {
        q: {d: float(s) for d, s in zip(document_ids, row.tolist()) if not (ignore and d == q)}
        for q, row in zip(query_ids, scores)
    }
    reference = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    assert set(per_query) == set(reference)
    for q, value in per_query.items():
        assert value == pytest.approx(reference[q]["ndcg_cut_10"], abs=1e-9), q
    assert mean == pytest.approx(sum(r["ndcg_cut_10"] for r in reference.values()) / len(reference), abs=1e-12)


@pytest.mark.parametrize("context_size", [0, 4])
def test_contextual_model_scores_as_the_evaluation_kit(tmp_path, make_tiny_cde, context_size):
    pytest.importorskip("mteb", reason="the evaluation kit needs mteb")
    from cde_st.evaluation import evaluate_model

    folder = make_folder(tmp_path)
    model = make_tiny_cde(context_size=8)
    kit = evaluate_model(
        model, [folder], context_size=context_size, context_seed=1, output_dir=None, show_progress_bar=False
    )
    ours = score_beir_folder(model, folder, context_size=context_size, context_seed=1, batch_size=8)
    assert ours["ndcg_at_k"] == pytest.approx(kit.score("toyndcg"), abs=1e-3)
    assert ours["context"]["size"] == context_size and ours["queries"] == 7 and ours["documents"] == 31
    assert ours["identical_ids_rule"].startswith("keep")


def test_plain_model_and_the_identical_ids_rule_from_the_texts(tmp_path, tiny_plain_model):
    pytest.importorskip("mteb", reason="the evaluation kit needs mteb")
    from cde_st.evaluation import evaluate_model

    folder = make_folder(tmp_path, "toyshared", shared_ids=True)  # query ids d0..d6 are corpus ids, other texts
    kit = evaluate_model(tiny_plain_model, [folder], output_dir=None, show_progress_bar=False)
    ours = score_beir_folder(tiny_plain_model, folder, batch_size=8)
    assert ours["context"] is None and ours["identical_ids_rule"].startswith("keep")
    assert ours["ndcg_at_k"] == pytest.approx(kit.score("toyshared"), abs=1e-3)
    ignored = score_beir_folder(tiny_plain_model, folder, batch_size=8, identical_ids="ignore")
    assert ignored["identical_ids_rule"].startswith("ignore")


def test_unknown_rule_is_refused(tmp_path, tiny_plain_model):
    with pytest.raises(ValueError, match="identical_ids"):
        score_beir_folder(tiny_plain_model, make_folder(tmp_path), identical_ids="drop")
