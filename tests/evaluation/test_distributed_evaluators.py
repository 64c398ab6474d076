"""In-training evaluation under a 2-process gloo run: sentence-transformers 6.2 splits an evaluator's inference across
the ranks (``distributed_evaluation``), while the evaluator sets the corpus context on rank 0 only. Every rank must
encode with that context, so the scores equal a single-process run's. Spawns processes: slow."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator
from sentence_transformers.util.distributed import distributed_evaluation

from cde_st import ContextualSentenceTransformer
from cde_st.evaluation.evaluators import ContextualEvaluator

WORLD = 2
S1 = [f"sentence {i} about {'rain' if i % 2 else 'the sun'} and {i % 5} clouds" for i in range(24)]
S2 = [f"text {i} on {'weather' if i % 3 else 'light'} number {i % 4}" for i in range(24)]
GOLD = [float((i * 7) % 5) for i in range(24)]


def _model(tiny_bert_dir: str) -> ContextualSentenceTransformer:
    torch.manual_seed(0)
    model = ContextualSentenceTransformer.from_encoder(
        tiny_bert_dir, context_size=8, max_seq_length=64, output_head="mlp", first_stage_residual=False,
        context_attention="joint",
    )  # fmt: skip
    return model.eval()


def _evaluator() -> ContextualEvaluator:
    sts = EmbeddingSimilarityEvaluator(S1, S2, GOLD, name="sts", batch_size=4)
    return ContextualEvaluator(sts, corpus=S1 + S2, seed=0)


def _worker(rank: int, init_file: str, tiny_bert_dir: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        model = _model(tiny_bert_dir)
        model.set_context(S2[:8], seed=rank)  # what training leaves: each rank's own (stale) context
        with distributed_evaluation(model) as run_evaluator:
            scores = _evaluator()(model) if run_evaluator else None
        if rank == 0:
            with open(out, "w") as f:
                json.dump(scores, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_scores_under_two_gloo_ranks_equal_a_single_process_run(tiny_bert_dir, tmp_path):
    model = _model(tiny_bert_dir)
    model.set_context(S2[:8], seed=5)
    expected = _evaluator()(model)
    out = tmp_path / "scores.json"
    mp.spawn(_worker, args=(str(tmp_path / "init"), tiny_bert_dir, str(out)), nprocs=WORLD, join=True)
    got = json.loads(out.read_text())
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-6), key
