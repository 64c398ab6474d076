"""CPU throughput of ONNX Runtime against torch, side by side in one run: all-MiniLM-L6-v2 and the cached contextual
model (the mini recipe: cached context read by the top three layers through a gate), each in torch, as an ONNX fp32
export and as its dynamic int8 quantisation, at 1 and 2 threads.

    python benchmarks/speed/bench_onnx.py [--docs 256] [--queries 768] [--batch-size 32] [--sizes 64 512]
        [--threads 1 2] [--workdir runs/bench_onnx]

The exports are written once under ``--workdir`` (git-ignored) with ``cde_st.export.export_onnx``; each thread count
then runs in its own process (ONNX Runtime takes its thread count when a session opens: ``torch.get_num_threads()``).
Texts: the first ``--docs`` SciFact documents (title + abstract, up to 256 tokens) and ``--queries`` SciFact queries;
each model encodes them in the same batches of ``--batch-size`` (sorted by length as sentence-transformers sorts),
the models taking turns on slices, best of two rounds. The contextual models have a SciFact context set (J
documents), so only the second stage is timed, as a user encoding a corpus sees it.

MiniLM's ONNX rows run its exported encoder (``onnx/model.onnx``, sentence-transformers' layout) on an ONNX Runtime
session with mean pooling and normalisation in numpy: what ``SentenceTransformer(path, backend="onnx")`` computes
(that route needs optimum-onnx, which requires transformers < 4.58, and cannot be installed beside this project's
transformers 5). Results: ``benchmarks/speed/results/onnx_speed.json`` and the table printed; recorded in
benchmarks/speed/RESULTS_onnx.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared harness

from harness import (  # noqa: E402
    REPO,
    command_line,
    emit_result,
    environment,
    markdown_table,
    parse_result,
    timed_calls,
    warm_up,
    write_json,
)

RESULTS = Path(__file__).resolve().parent / "results" / "onnx_speed.json"
MAX_SEQ_LENGTH = 256


def scifact_texts(docs: int, queries: int) -> tuple[list[str], list[str], list[str]]:
    """(the whole SciFact corpus, its first ``docs`` documents, its first ``queries`` queries)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_encode import scifact_docs, scifact_queries

    corpus = scifact_docs()
    return corpus, corpus[:docs], scifact_queries()[:queries]


class OrtBiEncoder:
    """A plain model's exported encoder on an ONNX Runtime session: tokenise, run, mean-pool, normalise."""

    def __init__(self, folder: Path, file_name: str, normalize: bool = True) -> None:
        import onnxruntime
        import torch
        from transformers import AutoTokenizer

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        graph = str(folder / "onnx" / file_name)
        self.session = onnxruntime.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.normalize = normalize

    def encode(self, texts: list[str], batch_size: int):
        import numpy as np

        order = np.argsort([-len(t) for t in texts], kind="stable")  # sentence-transformers' order
        out = np.empty((len(texts), 0), dtype=np.float32)
        parts = []
        for start in range(0, len(texts), batch_size):
            batch = [texts[i] for i in order[start : start + batch_size]]
            features = self.tokenizer(
                batch, padding=True, truncation=True, max_length=MAX_SEQ_LENGTH, return_tensors="np"
            )
            (hidden,) = self.session.run(None, {name: features[name].astype(np.int64) for name in self.inputs})
            mask = features["attention_mask"][..., None].astype(np.float32)
            pooled = (hidden * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)
            if self.normalize:
                pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
            parts.append(pooled)
        out = np.concatenate(parts)
        result = np.empty_like(out)
        result[order] = out
        return result


def prepare(workdir: Path, sizes: list[int]) -> dict[str, str]:
    """Export MiniLM and the cached contextual model at each J (once; reused when present): name -> folder."""
    import torch
    from sentence_transformers import SentenceTransformer

    from cde_st import ContextualSentenceTransformer
    from cde_st.defaults import default_surrogate_model_path
    from cde_st.export import export_onnx

    path = default_surrogate_model_path()
    corpus, _, _ = scifact_texts(0, 0)
    folders = {"minilm": workdir / "minilm"}
    if not folders["minilm"].exists():
        export_onnx(SentenceTransformer(path), folders["minilm"], quantize="int8")
    for size in sizes:
        folder = folders[f"cde-{size}"] = workdir / f"cde-j{size}"
        if folder.exists():
            continue
        torch.manual_seed(0)
        model = ContextualSentenceTransformer.from_encoder(path, context_size=size, prompts={})
        with torch.no_grad():  # a context read that adds something (speed does not depend on the values)
            model[0].gates.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
        model.eval()
        model.set_context(corpus, seed=0)
        export_onnx(model, folder, quantize="int8")
    return {name: str(folder) for name, folder in folders.items()}


def load_models(folders: dict[str, str]) -> dict:
    """Every row's model, loaded in this process (after its thread count is set)."""
    from sentence_transformers import SentenceTransformer

    from cde_st import ContextualSentenceTransformer

    models = {"MiniLM torch": SentenceTransformer(folders["minilm"])}
    for variant in ("model.onnx", "model_qint8.onnx"):
        models[f"MiniLM ONNX {'int8' if 'qint8' in variant else 'fp32'}"] = OrtBiEncoder(
            Path(folders["minilm"]), variant
        )
    for name, folder in folders.items():
        if not name.startswith("cde-"):
            continue
        size = name.split("-")[1]
        models[f"contextual J={size} torch"] = ContextualSentenceTransformer(folder)
        models[f"contextual J={size} ONNX fp32"] = ContextualSentenceTransformer(folder, backend="onnx")
        models[f"contextual J={size} ONNX int8"] = ContextualSentenceTransformer(
            folder, backend="onnx", model_kwargs={"file_name": "second_stage_qint8.onnx"}
        )
    for model in models.values():
        if hasattr(model, "max_seq_length"):
            model.max_seq_length = MAX_SEQ_LENGTH
    return models


def encode(model, texts: list[str], kind: str, batch_size: int):
    if isinstance(model, OrtBiEncoder):
        return model.encode(texts, batch_size)
    method = model.encode_query if kind == "query" else model.encode_document
    return method(texts, batch_size=batch_size, show_progress_bar=False)


def rates(models: dict, texts: list[str], kind: str, batch_size: int, rounds: int = 4) -> dict[str, float]:
    """texts/s of each model, the models taking turns on ``rounds`` slices; the best of two passes."""
    for model in models.values():
        warm_up(lambda model=model: encode(model, texts[: 2 * batch_size], kind, batch_size))
    best = dict.fromkeys(models, float("inf"))
    step = -(-len(texts) // rounds)
    for _ in range(2):
        seconds = dict.fromkeys(models, 0.0)
        for start in range(0, len(texts), step):
            chunk = texts[start : start + step]
            for name, model in models.items():
                (taken,), _ = timed_calls(lambda m=model, c=chunk: encode(m, c, kind, batch_size))
                seconds[name] += taken
        best = {name: min(best[name], seconds[name]) for name in models}
    return {name: len(texts) / s for name, s in best.items()}


def worker(args: argparse.Namespace) -> None:
    import torch

    threads = args.threads[0]
    torch.set_num_threads(threads)
    folders = json.loads(args.folders)
    models = load_models(folders)
    _, docs, queries = scifact_texts(args.docs, args.queries)
    result = {
        "threads": threads,
        "documents": rates(models, docs, "document", args.batch_size),
        "queries": rates(models, queries, "query", args.batch_size),
    }
    emit_result(result)


def table(results: list[dict]) -> list[str]:
    rows = []
    names = list(results[0]["documents"])
    for name in names:
        row = [name]
        for result in results:
            row += [result["documents"][name], result["queries"][name]]
        rows.append(row)
    columns = ["model"] + [f"{r['threads']} thr. {what}/s" for r in results for what in ("docs", "queries")]
    return markdown_table(columns, rows, "l" + "r" * (len(columns) - 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=256)
    parser.add_argument("--queries", type=int, default=768)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--workdir", default=str(REPO / "runs" / "bench_onnx"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--folders", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    folders = prepare(Path(args.workdir), args.sizes)
    results = []
    for threads in args.threads:
        command = [sys.executable, __file__, "--worker", "--threads", str(threads), "--folders", json.dumps(folders)]
        command += ["--docs", str(args.docs), "--queries", str(args.queries), "--batch-size", str(args.batch_size)]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        found = [parse_result(line) for line in done.stdout.splitlines() if parse_result(line)]
        if done.returncode or not found:
            sys.exit(f"worker with {threads} threads failed:\n{done.stderr[-3000:]}")
        results.append(found[0])
    env = environment("cpu", ("onnxruntime", "onnx", "transformers", "sentence-transformers"))
    write_json(RESULTS, {"command": command_line(), "environment": env, "results": results})
    print("\n".join(table(results)))
    print(f"machine: {env['device']}, {env['cpu_count']} cores; results: {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
