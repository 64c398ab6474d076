"""In-training evaluation: a BEIR folder scored with its own corpus as context.

A light sentence-transformers evaluator for ``SentenceTransformerTrainer(evaluator=...)``: before scoring, a
contextual model gets the context of the evaluated corpus (seeded sample, document prompt), exactly as the MTEB kit
does it; afterwards the model's previous context is restored. Scoring is sentence-transformers'
``InformationRetrievalEvaluator`` (NDCG@10 is the main score). Final numbers come from ``eval/run_mteb.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

from cde_st.model import contextual_module, is_contextual


class ContextualRetrievalEvaluator(InformationRetrievalEvaluator):
    """Retrieval evaluator for a BEIR folder (``corpus.jsonl[.gz]``, ``queries.jsonl``, ``qrels/{split}.tsv``).

    Args:
        folder: the BEIR folder.
        split: which qrels file to score.
        max_corpus: keep the judged documents plus a seeded sample of the others up to this many (faster,
            optimistic scores); ``None`` keeps the whole corpus.
        seed: context sampling (and corpus subsampling) seed.
        context_size: documents of the context; ``None`` uses the model's J.

    Example:
        >>> evaluator = ContextualRetrievalEvaluator("../shared/data/retrieval/scifact", split="test")  # doctest: +SKIP
        >>> evaluator(model)["scifact_cosine_ndcg@10"]                                                  # doctest: +SKIP
    """

    def __init__(
        self,
        folder: str | Path,
        split: str = "test",
        max_corpus: int | None = None,
        seed: int = 0,
        name: str | None = None,
        batch_size: int = 32,
        **kwargs,
    ) -> None:
        from cde_st.evaluation.local_tasks import load_retrieval_split

        data = load_retrieval_split(folder, split)
        corpus = {
            i: (t + " " + x).strip()
            for i, t, x in zip(data["corpus"]["id"], data["corpus"]["title"], data["corpus"]["text"])
        }
        queries = dict(zip(data["queries"]["id"], data["queries"]["text"]))
        relevant = {q: {d for d, s in rel.items() if s > 0} for q, rel in data["relevant_docs"].items()}
        if max_corpus is not None and max_corpus < len(corpus):
            judged = set().union(*relevant.values()) & set(corpus)
            others = sorted(set(corpus) - judged)
            rng = np.random.default_rng(seed)
            keep = judged | set(rng.choice(others, size=max(0, max_corpus - len(judged)), replace=False).tolist())
            corpus = {i: corpus[i] for i in corpus if i in keep}
        self.seed = seed
        super().__init__(
            queries=queries,
            corpus=corpus,
            relevant_docs=relevant,
            name=name or Path(folder).name,
            batch_size=batch_size,
            **kwargs,
        )

    def __call__(self, model, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        if not is_contextual(model):
            return super().__call__(model, output_path, epoch, steps)
        module = contextual_module(model)
        previous = (module.context_vectors, module.context_info)
        was_training = module.training
        try:
            module.set_context(self.corpus, seed=self.seed, prompt=model.prompts.get("document"))
            return super().__call__(model, output_path, epoch, steps)
        finally:
            module.context_vectors, module.context_info = previous
            module.train(was_training)
