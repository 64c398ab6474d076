"""NDCG@k of a model on a BEIR folder with torch alone: :func:`score_beir_folder`, :func:`ndcg_at_k`.

The evaluation kit (:func:`cde_st.evaluation.evaluate_model`) scores retrieval through mteb, which ranks with
torch and scores with pytrec_eval; the beir search needs beir and pytrec_eval too. This module gives the same
number without any of them, for machines where those packages are not installed (an accelerator machine with no
package index), and does what the kit does for a BEIR folder:

- documents are read as ``title + " " + text`` (:func:`cde_st.data.document_text`), queries are the judged ones;
- a contextual model's context is J documents sampled from the deduplicated corpus (:func:`cde_st.context.sample_context`,
  seeded), encoded with the retrieval document prefix; queries and documents get the kit's retrieval prefixes when
  prefixes are on (the default for a contextual model), the model's own prompts otherwise;
- similarity is the cosine of the embeddings; a query id that is also a corpus id is dropped from that query's
  results only under the "ignore" rule, which ``identical_ids="auto"`` chooses from the texts
  (:func:`cde_st.evaluation.identical_ids.queries_are_documents`), as the kit does for a folder;
- NDCG@k is trec_eval's ``ndcg_cut`` (what pytrec_eval computes): gain = the judged grade, discount
  ``log2(rank + 1)``, ideal ranking from the judgements, documents of equal score ranked by id in descending
  string order (trec_eval's tie rule, which decides between duplicate documents), averaged over the judged queries.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from cde_st.context import sample_context
from cde_st.data import load_beir
from cde_st.evaluation.identical_ids import IDENTICAL_IDS_RULES, queries_are_documents
from cde_st.evaluation.model_context import (
    clear_model_context,
    context_sizes,
    is_contextual_model,
    set_model_context,
)
from cde_st.evaluation.pools import unique_texts
from cde_st.evaluation.prefixes import TaskPrefixes

__all__ = ["ndcg_at_k", "score_beir_folder"]

# Candidates kept per query beyond k: documents tied at the k-th score (duplicates) must all be seen before the
# tie rule picks among them, and under the "ignore" rule the query's own id may take one of the places.
_TIE_SLACK = 32


def _dcg(gains: Sequence[float]) -> float:
    return sum(g / math.log2(rank + 2) for rank, g in enumerate(gains))


def ndcg_at_k(
    query_embeddings: torch.Tensor,
    document_embeddings: torch.Tensor,
    query_ids: Sequence[str],
    document_ids: Sequence[str],
    qrels: Mapping[str, Mapping[str, int]],
    k: int = 10,
    ignore_identical_ids: bool = False,
    chunk_size: int = 256,
) -> tuple[float, dict[str, float]]:
    """Mean NDCG@k (0-1) over the judged queries, and each query's NDCG@k, from cosine similarity.

    Args:
        query_embeddings: (Q, D), one row per ``query_ids``.
        document_embeddings: (N, D), one row per ``document_ids``.
        qrels: ``{query id: {document id: grade}}``; grades <= 0 are not relevant. Queries without a judgement
            are not scored (as pytrec_eval leaves them out).
        ignore_identical_ids: drop a document whose id is the query's id from that query's ranking.
        chunk_size: queries scored at once (bounds the (chunk, N) score block).

    Example:
        >>> q = torch.tensor([[1.0, 0.0]]); d = torch.tensor([[0.0, 1.0], [1.0, 0.1]])
        >>> ndcg_at_k(q, d, ["q1"], ["a", "b"], {"q1": {"b": 1}}, k=10)[0]
        1.0
    """
    if len(query_ids) != len(query_embeddings) or len(document_ids) != len(document_embeddings):
        raise ValueError(
            f"{len(query_ids)} query ids for {len(query_embeddings)} query embeddings, {len(document_ids)} document "
            f"ids for {len(document_embeddings)} document embeddings: give one id per row."
        )
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}.")
    queries = torch.nn.functional.normalize(query_embeddings.float(), dim=-1)
    documents = torch.nn.functional.normalize(document_embeddings.float().to(queries.device), dim=-1)
    keep = min(len(document_ids), k + _TIE_SLACK)
    per_query: dict[str, float] = {}
    for start in range(0, len(query_ids), chunk_size):
        block = queries[start : start + chunk_size] @ documents.T
        top_scores, top_rows = block.topk(keep, dim=1)
        for offset, (scores, rows) in enumerate(zip(top_scores.tolist(), top_rows.tolist())):
            qid = query_ids[start + offset]
            judged = qrels.get(qid)
            if not judged:
                continue
            ranked = [(score, document_ids[row]) for score, row in zip(scores, rows)]
            if ignore_identical_ids:
                ranked = [(score, did) for score, did in ranked if did != qid]
            # trec_eval: score descending, ties by document id descending (string order)
            ranked.sort(key=lambda item: item[1], reverse=True)
            ranked.sort(key=lambda item: item[0], reverse=True)
            gains = [max(judged.get(did, 0), 0) for _, did in ranked[:k]]
            ideal = _dcg(sorted((g for g in judged.values() if g > 0), reverse=True)[:k])
            per_query[qid] = _dcg(gains) / ideal if ideal > 0 else 0.0
    if not per_query:
        raise ValueError("No judged query among the query ids: nothing to score.")
    return sum(per_query.values()) / len(per_query), per_query


def _encode(model: Any, texts: list[str], role: str, prompt: str | None, batch_size: int) -> torch.Tensor:
    encode = model.encode_query if role == "query" else model.encode_document
    return encode(texts, prompt=prompt, batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False)


def score_beir_folder(
    model: Any,
    folder: str | Path,
    split: str = "test",
    *,
    k: int = 10,
    context_size: int | None = None,
    context_seed: int = 0,
    prefixes: bool | TaskPrefixes | None = None,
    identical_ids: str = "auto",
    batch_size: int = 128,
) -> dict[str, Any]:
    """Score ``model`` on split ``split`` of a BEIR folder: NDCG@k over the whole corpus, as the kit scores it.

    Args:
        model: a sentence-transformers model; a contextual one reads ``context_size`` documents of the corpus
            (default: its context slots; 0 is the null context). A plain model is scored without a context.
        prefixes: ``True``/``False`` forces the kit's retrieval prefixes on/off, a :class:`TaskPrefixes` gives
            them; default on for a contextual model, off for a plain one (which then uses its own prompts).
        identical_ids: ``"auto"`` (decided from the texts), ``"ignore"`` or ``"keep"``.

    Returns:
        ``{"ndcg_at_k": 0-100, "k", "queries", "documents", "identical_ids_rule", "context": {...} or None,
        "seconds", "per_query": {query id: 0-1}}``.
    """
    if identical_ids not in IDENTICAL_IDS_RULES:
        raise ValueError(f"identical_ids must be one of {IDENTICAL_IDS_RULES}, got {identical_ids!r}.")
    start = time.perf_counter()
    data = load_beir(folder, split)
    document_ids = list(data.corpus)
    texts = data.document_texts()
    documents = [texts[i] for i in document_ids]
    query_ids = list(data.queries)
    if identical_ids == "auto":
        ignore, why = queries_are_documents(data.queries, texts, data.qrels)
    else:
        ignore, why = identical_ids == "ignore", f"identical_ids={identical_ids!r} was asked for"
    contextual = is_contextual_model(model)
    chosen = prefixes if isinstance(prefixes, TaskPrefixes) else _chosen_prefixes(prefixes, contextual)
    query_prompt = chosen.for_inputs("Retrieval", "query") if chosen is not None else None
    document_prompt = chosen.for_inputs("Retrieval", "document") if chosen is not None else None
    context = None
    try:
        if contextual:
            context = _set_corpus_context(model, documents, context_size, context_seed, chosen, batch_size)
        with warnings.catch_warnings():
            if context is not None and not context["size"]:  # the null context is what was asked for
                warnings.filterwarnings("ignore", message="No context is set", category=UserWarning)
            query_embeddings = _encode(model, [data.queries[q] for q in query_ids], "query", query_prompt, batch_size)
            document_embeddings = _encode(model, documents, "document", document_prompt, batch_size)
    finally:
        if contextual:
            clear_model_context(model)
    mean, per_query = ndcg_at_k(
        query_embeddings, document_embeddings, query_ids, document_ids, data.qrels, k=k, ignore_identical_ids=ignore
    )
    verb = "ignore" if ignore else "keep"
    return {
        "ndcg_at_k": 100 * mean,
        "k": k,
        "queries": len(per_query),
        "documents": len(document_ids),
        "identical_ids_rule": f"{verb} identical query/document ids ({why})",
        "context": context,
        "seconds": time.perf_counter() - start,
        "per_query": per_query,
    }


def _chosen_prefixes(prefixes: bool | None, contextual: bool) -> TaskPrefixes | None:
    """The kit's retrieval prefixes when asked for (default: for a contextual model), else None."""
    return TaskPrefixes() if (contextual if prefixes is None else prefixes) else None


def _set_corpus_context(
    model: Any,
    documents: list[str],
    context_size: int | None,
    context_seed: int,
    chosen: TaskPrefixes | None,
    batch_size: int,
) -> dict[str, Any]:
    """Give a contextual model ``context_size`` documents of the corpus (the null context for 0); what was set."""
    size = context_sizes(model, True, "corpus", context_size)[0]
    pool = unique_texts(documents)
    sampled = sample_context(pool, size, context_seed) if size else []
    prompt = chosen.for_context("Retrieval") if chosen is not None else ""
    if sampled:
        fingerprint = set_model_context(model, sampled, context_seed, prompt, batch_size=batch_size).fingerprint
    else:
        clear_model_context(model)
        fingerprint = None
    return {
        "size": len(sampled),
        "seed": context_seed,
        "pool_size": len(pool),
        "prompt": prompt,
        "fingerprint": fingerprint,
    }
