"""The scale run's inputs: its data (a folder, or a ``.tar.xz`` of one, as ``benchmarks/gpu_prepare.sh`` packs it),
its base model (float16 weights, as packed, widened back to float32), and for ``--smoke`` a tiny encoder, the
built-in tiny pairs and four generated BEIR folders sent through the same path."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path

__all__ = ["CORPORA", "halve_model", "prepare_data", "run_inputs", "smoke_inputs", "widen_model"]

CORPORA = ("scifact", "med", "cacm", "lisa")
FIXED_MTIME_NS = 1_700_000_000 * 10**9


def prepare_data(data: Path, work: Path) -> Path:
    """The data folder: ``data`` itself, or a ``.tar.xz`` of it extracted under ``work``."""
    if data.is_dir():
        return data
    target = work / "data"
    target.mkdir()
    with tarfile.open(data, "r:*") as archive:
        archive.extractall(target, filter="data")
    return target


def widen_model(folder: Path, work: Path) -> Path:
    """The MiniLM folder with float32 weights: a float16 copy (as packed for the GPU machine) is widened in a temporary
    copy."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    if all(t.dtype != torch.float16 for t in tensors.values()):
        return folder
    target = work / "minilm32"
    shutil.copytree(folder, target, ignore=shutil.ignore_patterns("model.safetensors"))
    save_file(
        {k: (v.float() if v.dtype == torch.float16 else v).contiguous() for k, v in tensors.items()},
        target / "model.safetensors",
        metadata={"format": "pt"},
    )
    # The clustering cache knows a surrogate folder by its path and its files' sizes and mtimes: fixed mtimes (and a
    # fixed --work) let the GPU run find a clustering computed beforehand with --cluster-only and copied along.
    for file in target.rglob("*"):
        os.utime(file, ns=(FIXED_MTIME_NS, FIXED_MTIME_NS))
    return target


def halve_model(folder: Path, work: Path) -> Path:
    """A copy of a model folder with float16 weights (how ``benchmarks/gpu_prepare.sh`` packs ``.gpu/minilm``)."""
    from safetensors.torch import load_file, save_file

    target = work / f"{folder.name}-fp16"
    shutil.copytree(folder, target)
    tensors = load_file(folder / "model.safetensors")
    save_file(
        {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in tensors.items()},
        target / "model.safetensors",
        metadata={"format": "pt"},
    )
    return target


def smoke_inputs(work: Path) -> tuple[Path, str]:
    """The tiny encoder, the built-in tiny pairs (as a jsonl folder) and four generated BEIR folders."""
    import gzip

    from cde_st.training.pairs import tiny_pairs
    from cde_st.training.tiny import build_tiny_encoder

    encoder = build_tiny_encoder(work / "tiny", num_layers=6)  # the preset reads the context in layers 3-5
    data = work / "smoke_data"
    (data / "pairs").mkdir(parents=True)
    with gzip.open(data / "pairs" / "tiny.jsonl.gz", "wt", encoding="utf-8") as f:
        for row in tiny_pairs():
            f.write(json.dumps(row) + "\n")
    topics = ["rain", "stocks", "proteins", "glaciers", "courts", "coffee", "music", "networks"]
    for c, name in enumerate(CORPORA):
        folder = data / "retrieval" / name
        (folder / "qrels").mkdir(parents=True)
        docs = [
            {"_id": str(i), "title": "", "text": f"a passage number {i} explaining {topics[(i + c) % 8]}"}
            for i in range(40)
        ]
        queries = [{"_id": str(100 + i), "text": f"question about {topics[(i + c) % 8]}"} for i in range(8)]
        (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
        (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
        qrels = "".join(f"{100 + i}\t{i + 8 * k}\t1\n" for i in range(8) for k in range(2))
        (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    return data, encoder


def run_inputs(args, work: Path) -> tuple[Path, str]:
    """The data folder and the float32 base model; ``--smoke`` builds tiny ones and sends them through the real
    run's input path (a .tar.xz of the data, float16 weights widened back to float32)."""
    if not args.smoke:
        return prepare_data(args.data, work), str(widen_model(args.model, work))
    args.batch_size, args.context_size, args.eval_sizes = 8, 8, args.eval_sizes or [0, 4, 8]
    args.eval_batch_size, args.logging_steps = 16, 2
    folder, encoder = smoke_inputs(work)
    archive = work / "smoke_data.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        for part in folder.iterdir():
            tar.add(part, arcname=part.name)
    return prepare_data(archive, work), str(widen_model(halve_model(Path(encoder), work), work))
