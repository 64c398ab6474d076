"""Data-parallel training on 2 CPU processes (gloo): the contextual loss under DistributedDataParallel gives every
parameter of both stages the gradient of a single process computing the same per-rank batches, and the drop-in
script really trains data-parallel under torchrun (cde_st/distributed.py). Both tests spawn processes: slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from sentence_transformers import SentenceTransformer
from sentence_transformers.models import Pooling, Transformer
from torch.nn.parallel import DistributedDataParallel

from cde_st import ContextualSentenceTransformer
from cde_st.losses import FilteredInfoNCELoss, false_negative_mask
from cde_st.prompts import DOCUMENT_PROMPT, QUERY_PROMPT

WORLD = 2
QUERIES = [
    "what causes rain", "who wrote hamlet", "how do vaccines work", "why is the sky blue", "what is a black hole",
    "how do plants make food", "what is inflation", "who painted the mona lisa", "how does a battery store energy",
    "what is dna", "why do cats purr",
]  # fmt: skip
DOCS = [
    "Rain forms when water vapour condenses into droplets heavy enough to fall.",
    "Hamlet is a tragedy written by William Shakespeare around 1600.",
    "Vaccines train the immune system to recognise a pathogen without causing disease.",
    "Sunlight is scattered by air molecules, and blue light is scattered the most.",
    "A black hole is a region of spacetime where gravity prevents anything from escaping.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
    "Inflation is the rate at which the general level of prices rises.",
    "The Mona Lisa was painted by Leonardo da Vinci in the early sixteenth century.",
    "A battery stores energy chemically and releases it as an electric current.",
    "DNA is the molecule that carries the genetic instructions of living organisms.",
    "Cats purr by vibrating the muscles of their larynx as they breathe.",
]
# Each rank's own batch: rank 1 gets one row fewer (a last, smaller batch), which cross-rank gathering must handle.
RANK_ROWS = [list(range(0, 6)), list(range(6, 11))]
F64_TOL = 1e-9

# name: (mini_batch_size, gather_across_devices, bidirectional)
MODES = {
    "direct": (None, False, False),
    "cached": (2, False, False),
    "cached-gather-bidirectional": (2, True, True),
}


def _models(tiny_bert_dir: str):
    torch.manual_seed(0)
    model = ContextualSentenceTransformer.from_encoder(
        tiny_bert_dir, context_size=8, max_seq_length=64, output_head="mlp", first_stage_residual=False,
        sequence_dropout=0.0, context_attention="joint",  # joint: the first stage gets gradients from step 0
    ).to(torch.float64)  # fmt: skip
    model.train()
    torch.manual_seed(123)
    transformer = Transformer(tiny_bert_dir, max_seq_length=64)
    guide = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")])
    guide.eval()
    return model, guide


def _loss(model, guide, mode: str) -> FilteredInfoNCELoss:
    mini_batch_size, gather, bidirectional = MODES[mode]
    return FilteredInfoNCELoss(
        model, guide=guide, temperature=0.05, margin=0.0, mini_batch_size=mini_batch_size,
        context_mini_batch_size=mini_batch_size and 3, bidirectional=bidirectional, gather_across_devices=gather,
    )  # fmt: skip


def _columns(model, rank: int):
    rows = RANK_ROWS[rank]
    return [
        model.preprocess([QUERIES[i] for i in rows], prompt=QUERY_PROMPT),
        model.preprocess([DOCS[i] for i in rows], prompt=DOCUMENT_PROMPT),
    ]


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _worker(rank: int, init_file: str, tiny_bert_dir: str, out: str) -> None:
    """One rank: a step of every mode in turn (fresh models each, the same seeds), in one process group."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        for mode in sorted(MODES):
            model, guide = _models(tiny_bert_dir)
            loss = _loss(model, guide, mode)
            loss.model = DistributedDataParallel(model)  # what SentenceTransformerTrainer does under torchrun
            value = loss(_columns(model, rank), None)
            value.backward()
            grads = _grads(model)
            torch.optim.SGD(model.parameters(), lr=0.5).step()
            result = {"loss": value.detach(), "grads": grads, "weights": model.state_dict()}
            torch.save(result, f"{out}/{mode}-rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ddp_steps(tiny_bert_dir, tmp_path_factory) -> Path:
    """The folder of every mode's per-rank results: one launch of 2 gloo processes serves the three modes (each
    process start imports torch and transformers)."""
    out = tmp_path_factory.mktemp("ddp")
    mp.spawn(_worker, args=(str(out / "init"), tiny_bert_dir, str(out)), nprocs=WORLD, join=True)
    return out


def _reference(tiny_bert_dir: str, mode: str) -> dict[str, torch.Tensor]:
    """One process, no DDP: the gradient of the mean over ranks of each rank's loss on its own batch and context."""
    model, guide = _models(tiny_bert_dir)
    loss = _loss(model, guide, mode)
    loss.mini_batch_size = loss.context_mini_batch_size = None  # the plain autograd path as the reference
    if not MODES[mode][1]:
        for rank in range(WORLD):
            (loss(_columns(model, rank), None) / WORLD).backward()
        return _grads(model)
    # Cross-rank negatives: every rank's rows (each embedded against its own batch's context) are candidates of
    # every query; the mean over ranks of the per-rank losses is the loss over all rows when batches are equal, so
    # weight each rank's rows by 1 / (WORLD * B_r) as the ranks' own means do.
    module = loss._contextual_module()
    reps, guide_reps, weights = [[], []], [[], []], []
    for rank in range(WORLD):
        columns = _columns(model, rank)
        for side, vectors in enumerate(loss._guide_embeddings([dict(c) for c in columns])):
            guide_reps[side].append(vectors)
        context_vectors = loss._embed_context(module, loss._context_features(module, columns[1])[0])
        for side, column in enumerate(columns):
            reps[side].append(model(dict(column), context_vectors=context_vectors)["sentence_embedding"])
        rows = len(RANK_ROWS[rank])
        weights.append(torch.full((rows,), 1.0 / (WORLD * rows), dtype=torch.float64))
    weights = torch.cat(weights)
    total = 0.0
    guide_all = [torch.cat(g) for g in guide_reps]
    queries, documents = torch.cat(reps[0]), torch.cat(reps[1])
    for i in range(len(weights)):  # row by row, with the loss's own formula over all candidates
        row_loss = _row_loss(loss, queries, documents, guide_all, i)
        total = total + weights[i] * row_loss
    total.backward()
    return _grads(model)


def _row_loss(loss: FilteredInfoNCELoss, queries, documents, guide_reps, i: int) -> torch.Tensor:
    """calculate_loss restricted to row i of the gathered batch (its sum over rows is the unweighted loss)."""
    n = queries.shape[0]
    cos = torch.nn.functional.cosine_similarity
    scale = loss.scale
    own = torch.tensor([i])
    blocks = [cos(queries[i : i + 1], documents) * scale]
    blocks[0] = blocks[0].masked_fill(
        false_negative_mask(guide_reps[0][own], guide_reps[1], loss.margin, positive_index=own), -torch.inf
    )
    positive = blocks[0][0, i]
    guide_pos = (guide_reps[0][i] * guide_reps[1][i]).sum().reshape(1)
    for row, cands, g_row, g_cands in (
        (queries[i : i + 1], queries, guide_reps[0], guide_reps[0]),
        (documents[i : i + 1], queries, guide_reps[1], guide_reps[0]),
        (documents[i : i + 1], documents, guide_reps[1], guide_reps[1]),
    ):
        removed = torch.zeros(1, n, dtype=torch.bool)
        removed[0, i] = True
        removed |= false_negative_mask(g_row[own], g_cands, loss.margin, positive_scores=guide_pos)
        blocks.append((cos(row, cands) * scale).masked_fill(removed, -torch.inf))
    return torch.logsumexp(torch.cat(blocks, dim=1), dim=1)[0] - positive


@pytest.mark.slow  # two processes
@pytest.mark.parametrize("mode", sorted(MODES))
def test_ddp_gradients_equal_a_single_process(tiny_bert_dir, ddp_steps, mode):
    """After one step on 2 gloo processes, every parameter of both stages has the gradient of the mean of the
    ranks' losses computed in one process (float64, relative tolerance 1e-9 of the gradient norm), and the weights
    are bit-identical across ranks after the optimiser step."""
    ranks = [torch.load(ddp_steps / f"{mode}-rank{r}.pt") for r in range(WORLD)]
    reference = _reference(tiny_bert_dir, mode)

    assert any(n.startswith("0.first_stage.") for n in reference), "the first stage must receive gradients"
    assert any(n.startswith("0.second_stage.") for n in reference)
    total = torch.sqrt(sum(g.norm() ** 2 for g in reference.values()))
    for result in ranks:
        assert set(result["grads"]) == set(reference)
        for name, grad in reference.items():
            error = (result["grads"][name] - grad).norm()
            assert error <= F64_TOL * (grad.norm() + total), f"{name}: {error:.2e} (norm {grad.norm():.2e})"
    # each rank computed its own batch's loss (the guide removes some, not all, negatives: the loss is not 0)
    assert all(result["loss"] > 0.1 for result in ranks)
    assert not torch.equal(ranks[0]["loss"], ranks[1]["loss"])
    assert total > 0
    for name, weight in ranks[0]["weights"].items():
        assert torch.equal(weight, ranks[1]["weights"][name]), f"{name} differs across ranks after the step"


@pytest.mark.slow  # two torchrun processes training the tiny preset
def test_torchrun_trains_data_parallel(tmp_path):
    """`torchrun --nproc_per_node 2 train/train_cde.py --preset tiny`: both processes share the data (half the steps
    of one process over the same pairs), only rank 0 writes the output folder."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = tmp_path / "run"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(WORLD)]
    command += [str(root / "train" / "train_cde.py"), "--preset", "tiny", "--output-dir", str(out)]
    command += ["--set", "max_steps=-1", "num_train_epochs=1"]
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "parallel_mode != ParallelMode.DISTRIBUTED" not in result.stderr
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["processes"] == WORLD
    assert summary["steps"] == summary["pairs"] // (8 * WORLD)  # tiny preset: batch 8 per rank, one epoch
    assert (out / "final" / "modules.json").exists()
    saving = [line for line in result.stderr.splitlines() if "Saving model checkpoint to" in line]
    assert len(saving) == 2, saving  # checkpoint-2 and checkpoint-4, each written by rank 0 alone
