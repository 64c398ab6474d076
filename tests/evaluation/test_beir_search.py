"""beir users get CDE: ContextualExactSearch sets the corpus context before beir encodes any query."""

from __future__ import annotations

import gzip
import importlib
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("beir", reason="beir is not installed (pip install -e '.[dev]')")

from beir.datasets.data_loader import GenericDataLoader  # noqa: E402
from beir.retrieval.evaluation import EvaluateRetrieval  # noqa: E402

from cde_st.context import sample_context  # noqa: E402
from cde_st.evaluation import evaluate_model  # noqa: E402
from cde_st.evaluation.beir_search import ContextualExactSearch  # noqa: E402

TOPICS = ["rain and clouds", "stock markets", "protein folding", "glacier melt", "court rulings", "coffee farming"]


def make_beir_folder(root: Path, name: str = "toybeir") -> Path:
    """A small BEIR folder (uncompressed, as beir's GenericDataLoader reads it)."""
    folder = root / name
    (folder / "qrels").mkdir(parents=True)
    docs = [
        {"_id": f"d{i}", "title": f"Report {i}" if i % 3 else "", "text": f"{TOPICS[i % 6]} study number {i}"}
        for i in range(36)
    ]
    queries = [{"_id": f"q{i}", "text": f"what is new in {TOPICS[i % 6]}?"} for i in range(8)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    qrels = "".join(f"q{i}\td{i + 6 * k}\t1\n" for i in range(8) for k in range(2))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    return folder


def beir_ndcg10(search: ContextualExactSearch, folder: Path | None = None, **files: str) -> float:
    loader = GenericDataLoader(str(folder)) if folder is not None else GenericDataLoader(**files)
    corpus, queries, qrels = loader.load(split="test") if folder is not None else loader.load_custom()
    retriever = EvaluateRetrieval(search, score_function="cos_sim")
    ndcg, _map, _recall, _precision = retriever.evaluate(qrels, retriever.retrieve(corpus, queries), [10])
    return 100 * ndcg["NDCG@10"]


def test_context_comes_from_the_corpus_before_any_query_is_encoded(tmp_path, make_tiny_cde, monkeypatch):
    """beir's search encodes the queries first: without ContextualExactSearch they would get the null context."""
    folder = make_beir_folder(tmp_path)
    model = make_tiny_cde(context_size=8)
    seen = []
    encode_query = model.encode_query

    def spy(texts, **kwargs):
        from cde_st import contextual_module

        seen.append((contextual_module(model).context_info, kwargs.get("prompt")))
        return encode_query(texts, **kwargs)

    monkeypatch.setattr(model, "encode_query", spy)
    search = ContextualExactSearch(model, batch_size=16, context_size=4, context_seed=3, show_progress_bar=False)
    beir_ndcg10(search, folder)
    (info, prompt), *_ = seen
    assert info is not None and info.size == 4 and prompt == "search_query: "
    assert search.context_log == [
        {"size": 4, "seed": 3, "pool_size": 36, "prompt": "search_document: ", "fingerprint": info.fingerprint}
    ]
    # the kit's rule: title + " " + text, sampled with sample_context, embedded with the document prefix
    from cde_st import contextual_module
    from cde_st.context import fingerprint_array

    rows = [json.loads(line) for line in (folder / "corpus.jsonl").read_text().splitlines()]
    pool = [f"{r['title']} {r['text']}".strip() for r in rows]
    vectors = contextual_module(model).embed_context_texts(
        ["search_document: " + t for t in sample_context(pool, 4, 3)]
    )
    assert info.fingerprint == fingerprint_array(vectors.detach().cpu().numpy())
    assert contextual_module(model).context_info is None  # cleared after the search


@pytest.mark.parametrize("context_size", [0, 4, 8])
def test_contextual_scores_match_the_evaluation_kit(tmp_path, make_tiny_cde, context_size):
    """Same folder, J and seed: beir's number through ContextualExactSearch is the kit's number."""
    folder = make_beir_folder(tmp_path)
    model = make_tiny_cde(context_size=8)
    kit = evaluate_model(
        model, [folder], context_size=context_size, context_seed=1, output_dir=None, show_progress_bar=False
    )
    search = ContextualExactSearch(model, context_size=context_size, context_seed=1, show_progress_bar=False)
    assert beir_ndcg10(search, folder) == pytest.approx(kit.score("toybeir"), abs=1e-3)


def test_plain_model_is_searched_without_context_or_prefixes(tmp_path, tiny_plain_model_beir):
    folder = make_beir_folder(tmp_path)
    search = ContextualExactSearch(tiny_plain_model_beir, show_progress_bar=False)
    assert search.contextual is False and search.prefixes is None
    kit = evaluate_model(tiny_plain_model_beir, [folder], output_dir=None, show_progress_bar=False)
    assert beir_ndcg10(search, folder) == pytest.approx(kit.score("toybeir"), abs=1e-3)
    assert search.context_log == []


@pytest.fixture
def tiny_plain_model_beir(tiny_bert_dir):
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling

    torch.manual_seed(0)
    transformer = Transformer(tiny_bert_dir, max_seq_length=64)
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension())])
    return model.eval()


def test_bad_arguments_name_the_problem(make_tiny_cde):
    with pytest.raises(TypeError, match="pass the SentenceTransformer itself"):
        ContextualExactSearch(object())
    with pytest.raises(ValueError, match=r"context_seed must be an integer in \[0, 2\*\*32\), got -1"):
        ContextualExactSearch(make_tiny_cde(context_size=4), context_seed=-1)
    with pytest.raises(ValueError, match=r"exceed the model's 4 context slots"):
        ContextualExactSearch(make_tiny_cde(context_size=4), context_size=5)


def test_without_beir_the_import_error_names_the_extra(monkeypatch):
    for name in list(sys.modules):
        if name == "beir" or name.startswith("beir."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "beir", None)
    monkeypatch.delitem(sys.modules, "cde_st.evaluation.beir_search")
    with pytest.raises(ImportError, match=r"pip install 'cde_st\[beir\]'"):
        importlib.import_module("cde_st.evaluation.beir_search")


# ------------------------------------------------------------------------------------------------------------
# Real collections, on a seeded slice each (a seeded sample of the test queries, every document judged for them, then
# a seeded sample of the others): the whole of SciFact (5,183 long documents) took minutes to encode on a 2-core CPU,
# and what these tests check, that beir's route and the kit's give one score for one model, context and corpus, holds
# on any corpus. The kit's full-corpus SciFact score (64.51, the published one) is docs/RESULTS.md's calibration.


def beir_slice(
    shared_data: Path, tmp_path_factory, name: str, max_docs: int, max_queries: int | None = None, seed: int = 0
) -> Path:
    """A BEIR folder (plain corpus.jsonl, as beir's GenericDataLoader reads it) with ``max_queries`` of the test
    queries of ``name`` (a seeded sample; all when None), their qrels, and at most ``max_docs`` of its documents (more
    only if the ones judged for those queries alone exceed it)."""
    import random

    source = shared_data / "retrieval" / name
    folder = tmp_path_factory.mktemp(f"{name}_slice")
    (folder / "qrels").mkdir()
    header, *rows = [line for line in (source / "qrels" / "test.tsv").read_text().splitlines() if line.strip()]
    query_ids = sorted({row.split("\t")[0] for row in rows})
    if max_queries is not None:
        query_ids = random.Random(seed).sample(query_ids, min(max_queries, len(query_ids)))
    wanted = set(query_ids)
    rows = [row for row in rows if row.split("\t")[0] in wanted]
    (folder / "qrels" / "test.tsv").write_text("".join(line + "\n" for line in [header, *rows]))
    judged = {row.split("\t")[1] for row in rows}
    with gzip.open(source / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    keep = [line for line in lines if json.loads(line)["_id"] in judged]
    others = [line for line in lines if json.loads(line)["_id"] not in judged]
    keep += random.Random(seed).sample(others, max(0, min(len(others), max_docs - len(keep))))
    (folder / "corpus.jsonl").write_text("".join(keep), encoding="utf-8")
    queries = (source / "queries.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    kept_queries = [line for line in queries if line.strip() and json.loads(line)["_id"] in wanted]
    (folder / "queries.jsonl").write_text("".join(kept_queries), encoding="utf-8")
    assert len(kept_queries) == len(query_ids) and judged <= {json.loads(line)["_id"] for line in keep}
    assert len(keep) >= min(max_docs, len(lines)) // 2
    return folder


def beir_files(folder: Path) -> dict[str, str]:
    return {
        "corpus_file": str(folder / "corpus.jsonl"),
        "query_file": str(folder / "queries.jsonl"),
        "qrels_file": str(folder / "qrels" / "test.tsv"),
    }


@pytest.mark.slow
def test_minilm_through_beir_matches_the_kit_on_scifact(shared_data, tmp_path_factory, minilm):
    from sentence_transformers import SentenceTransformer

    folder = beir_slice(shared_data, tmp_path_factory, "scifact", max_docs=120, max_queries=40)
    model = SentenceTransformer(minilm)
    model.max_seq_length = 128  # SciFact abstracts are long: both routes cut them alike, at half the tokens
    search = ContextualExactSearch(model, batch_size=64, show_progress_bar=False)
    score = beir_ndcg10(search, **beir_files(folder))
    kit = evaluate_model(
        model, [folder], prefixes=False, identical_ids="ignore", output_dir=None, show_progress_bar=False
    )
    print(f"all-MiniLM-L6-v2 on a SciFact slice, NDCG@10: beir {score:.3f}, kit {kit.score(folder.name):.3f}")
    assert 40 < score < 100  # a working retriever on the slice, not a degenerate score
    assert score == pytest.approx(kit.score(folder.name), abs=0.01)


@pytest.mark.slow
def test_contextual_minilm_through_beir_matches_the_kit_on_cacm(shared_data, tmp_path_factory, minilm):
    from cde_st import ContextualSentenceTransformer

    folder = beir_slice(shared_data, tmp_path_factory, "cacm", max_docs=100, max_queries=8)
    # 128 tokens: both routes cut the longer abstracts alike, at half the tokens of MiniLM's 256
    model = ContextualSentenceTransformer.from_encoder(minilm, context_size=64, max_seq_length=128)
    model.eval()
    search = ContextualExactSearch(model, batch_size=64, context_size=64, context_seed=0, show_progress_bar=False)
    beir_score = beir_ndcg10(search, **beir_files(folder))
    kit = evaluate_model(
        model,
        [folder],
        context_size=64,
        context_seed=0,
        identical_ids="ignore",  # beir's search always leaves out a document whose id is the query's id
        output_dir=None,
        show_progress_bar=False,
    )
    print(
        f"contextual MiniLM (J=64, seed 0), CACM slice NDCG@10: beir {beir_score:.3f}, kit {kit.score(folder.name):.3f}"
    )
    assert beir_score == pytest.approx(kit.score(folder.name), abs=0.01)
