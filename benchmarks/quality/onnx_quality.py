"""What the ONNX export of a contextual model changes: agreement of the fp32 graphs with torch, and the retrieval
quality of the dynamic int8 graphs against fp32, on SciFact, MED, CACM and LISA (../shared/data).

    python benchmarks/quality/onnx_quality.py --model FOLDER --name NAME [--tasks scifact med cacm lisa]
        [--docs 256] [--workdir runs/onnx_quality]
    python benchmarks/quality/onnx_quality.py --model minilm --name minilm

``--model``: a saved cde_st model folder (exported to ``--workdir/NAME`` with its int8 graphs unless it already holds
an export), or ``minilm``: all-MiniLM-L6-v2 as an untrained cde_st model (``from_encoder``, J = 64; its context
gates start at zero, so it gives MiniLM's own embeddings exactly, through a graph that also holds the context read).

1. Agreement: the first ``--docs`` SciFact documents and the SciFact test queries, encoded by torch, the fp32 and the
   int8 graphs under two contexts (SciFact's own sample, seed 0, and MED's): per embedding the largest absolute
   difference and the cosine, worst case over the texts.
2. Quality: ``cde_st.evaluation.evaluate_model`` on the tasks with ``backend="onnx"``, fp32 and int8 graphs
   (contexts sampled from each task's own corpus as always), NDCG@10 per task and the mean.

Writes ``benchmarks/quality/results/onnx_quality_NAME.json`` and prints the tables (benchmarks/speed/RESULTS_onnx.md).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared harness

import numpy as np  # noqa: E402
from harness import REPO, command_line, environment, log, markdown_table, write_json  # noqa: E402

DATA = REPO.parent / "shared" / "data"
RESULTS = Path(__file__).resolve().parent / "results"
INT8 = "second_stage_qint8.onnx"


def corpus_texts(task: str) -> list[str]:
    from cde_st.data import document_text

    with gzip.open(DATA / "retrieval" / task / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        return [document_text(r.get("title"), r["text"]) for r in map(json.loads, f)]


def test_queries(task: str) -> list[str]:
    qrels = (DATA / "retrieval" / task / "qrels" / "test.tsv").read_text().splitlines()[1:]
    wanted = {line.split("\t")[0] for line in qrels}
    with open(DATA / "retrieval" / task / "queries.jsonl", encoding="utf-8") as f:
        return [r["text"] for r in map(json.loads, f) if r["_id"] in wanted]


def exported_folder(model: str, name: str, workdir: Path) -> Path:
    """The export of ``model`` (written once under ``workdir``), with its int8 graphs."""
    import torch

    from cde_st import ContextualSentenceTransformer
    from cde_st.defaults import default_surrogate_model_path
    from cde_st.export import export_onnx

    if model != "minilm" and (Path(model) / "onnx" / INT8).is_file():
        return Path(model)
    folder = workdir / name
    if not (folder / "onnx" / INT8).is_file():
        if model == "minilm":
            torch.manual_seed(0)
            loaded = ContextualSentenceTransformer.from_encoder(default_surrogate_model_path(), context_size=64)
        else:
            loaded = ContextualSentenceTransformer(model)
        export_onnx(loaded, folder, quantize="int8")
    return folder


def agreement(folder: Path, docs: int) -> list[dict]:
    """Per context, text kind and graph: the worst absolute difference and cosine against torch."""
    from cde_st import ContextualSentenceTransformer

    models = {
        "torch": ContextualSentenceTransformer(str(folder)),
        "fp32": ContextualSentenceTransformer(str(folder), backend="onnx"),
        "int8": ContextualSentenceTransformer(str(folder), backend="onnx", model_kwargs={"file_name": INT8}),
    }
    scifact = corpus_texts("scifact")
    texts = {"documents": scifact[:docs], "queries": test_queries("scifact")}
    rows = []
    for context in ("scifact", "med"):
        for model in models.values():
            model.set_context(scifact if context == "scifact" else corpus_texts("med"), seed=0)
        for kind, batch in texts.items():
            encode = "encode_query" if kind == "queries" else "encode_document"
            expected = getattr(models["torch"], encode)(batch, batch_size=32, normalize_embeddings=True)
            for graph in ("fp32", "int8"):
                got = getattr(models[graph], encode)(batch, batch_size=32, normalize_embeddings=True)
                cosine = (expected * got).sum(1)  # unit vectors
                row = {"context": context, "texts": kind, "n": len(batch), "graph": graph}
                row.update(max_abs_diff=float(np.abs(expected - got).max()), min_cosine=float(cosine.min()))
                rows.append(row)
                log(f"agreement {row}")
    return rows


def quality(folder: Path, tasks: list[str]) -> dict[str, dict[str, float]]:
    """NDCG@10 x100 per task and graph, with the mean."""
    from cde_st.evaluation import evaluate_model

    scores = {}
    for graph, file_name in (("fp32", None), ("int8", INT8)):
        report = evaluate_model(
            str(folder), tasks, data_dir=DATA, output_dir=None, batch_size=32, show_progress_bar=False,
            backend="onnx", onnx_file=file_name,
        )  # fmt: skip
        scores[graph] = {task: report.score(task) for task in tasks}
        scores[graph]["mean"] = float(np.mean([scores[graph][task] for task in tasks]))
        log(f"quality {graph}: {scores[graph]}")
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a cde_st model folder, or 'minilm'")
    parser.add_argument("--name", required=True, help="the results' name (and the export's folder)")
    parser.add_argument("--tasks", nargs="+", default=["scifact", "med", "cacm", "lisa"])
    parser.add_argument("--docs", type=int, default=256, help="SciFact documents in the agreement check")
    parser.add_argument("--workdir", default=str(REPO / "runs" / "onnx_quality"))
    args = parser.parse_args()
    if not DATA.is_dir():
        sys.exit(f"the shared data is not at {DATA}")
    folder = exported_folder(args.model, args.name, Path(args.workdir))
    agreed = agreement(folder, args.docs)
    scores = quality(folder, args.tasks)
    env = environment("cpu", ("onnxruntime", "onnx", "transformers", "sentence-transformers"))
    out = RESULTS / f"onnx_quality_{args.name}.json"
    write_json(out, {"command": command_line(), "environment": env, "agreement": agreed, "ndcg@10": scores})
    columns = ["context", "texts", "n", "graph", "max abs diff", "min cosine"]
    print("\n".join(markdown_table(columns, [[r[c.replace(" ", "_")] for c in columns[:4]] + [
        r["max_abs_diff"], r["min_cosine"]] for r in agreed])))  # fmt: skip
    tasks = [*args.tasks, "mean"]
    rows = [[graph] + [scores[graph][t] for t in tasks] for graph in scores]
    rows.append(["int8 - fp32"] + [scores["int8"][t] - scores["fp32"][t] for t in tasks])
    print("\n".join(markdown_table(["graph", *tasks], rows, "l" + "r" * len(tasks))))
    print(f"results: {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
