"""Is the drift of an embedded corpus meaningful? The mixing table (results: benchmarks/embed/RESULTS_embed.md,
"Drift on mixed corpora"; JSON: benchmarks/embed/results/drift_mixing.json).

A SciFact sample is embedded with a context sampled from it (``embed_corpus``, J as the model's, seeded); then
documents are appended in steps of 10, 20, 30 and 50% of its size through the update path (``update_corpus``:
only the new documents are embedded, with the recorded context), in two chains: MED documents (another domain) and,
as the control, held-back SciFact documents. At each step it records the drift the update measured
(``corpus_drift``) and NDCG@10 of SciFact's and MED's test queries, each set scored over the whole mixed corpus,
with (a) the old context (the folder as the update left it), (b) a fresh context sampled from the mixed corpus (the
same J and seed; ``recontextualize_corpus`` on a copy of the folder) and (c) no context (J = 0, the floor). Every
SciFact document a test query judges is kept; MED is smaller than its steps need whole, so each step holds a seeded
random share of it (the earlier steps' documents included) and a MED query is scored on the judged documents present
(a query with none present is left out, and counted).

Run from the repository root (reads ../shared/data/retrieval/{scifact,med}; about 26,000 document forwards at the
defaults, 3 seeds)::

    OMP_NUM_THREADS=1 python benchmarks/quality/drift_mixing.py runs/bench_onnx/cde-j64 --work-dir /tmp/drift_mixing

Seeds run one after the other and the JSON is written after each; ``--time-budget`` (s) skips a seed that would
not finish within it, and the results say which ran.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import command_line, environment, log, markdown_table, write_json  # noqa: E402

from cde_st.corpus import corpus_drift, embed_corpus, read_manifest, read_shard  # noqa: E402
from cde_st.corpus.corpus_context import context_path, read_context_file  # noqa: E402
from cde_st.corpus.update import recontextualize_corpus, update_corpus  # noqa: E402
from cde_st.data import load_beir  # noqa: E402
from cde_st.evaluation.ndcg import ndcg_at_k  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data" / "retrieval"
RESULTS = REPO / "benchmarks" / "embed" / "results" / "drift_mixing.json"
#: The steps: documents appended, as a share of the SciFact sample's size (cumulative).
STEPS = (0.10, 0.20, 0.30, 0.50)
MIXES = ("med", "scifact")  # what is appended: another domain, or held-back documents of the corpus's own kind
QUERY_SETS = ("scifact", "med")


@dataclass
class MixingData:
    """The documents (prefixed ids: ``scifact/...``, ``med/...``), the queries and their judgements, and which
    documents make the base corpus and each chain's additions, in the order they are appended."""

    texts: dict[str, str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    base: list[str]
    added: dict[str, list[str]] = field(default_factory=dict)

    def query_ids(self, query_set: str) -> list[str]:
        return [q for q in self.queries if q.startswith(query_set + "/")]


def load_mixing_data(scifact_dir: Path, med_dir: Path, scifact_docs: int, seed: int = 0) -> MixingData:
    """SciFact's judged documents plus random others up to ``scifact_docs``; held-back SciFact documents and MED
    documents (random orders, seeded) for the two chains, as many as the last step appends."""
    rng = random.Random(seed)
    texts, queries, qrels = {}, {}, {}
    pools = {}
    for name, folder in (("scifact", scifact_dir), ("med", med_dir)):
        split = load_beir(folder, "test")
        texts.update({f"{name}/{i}": t for i, t in split.document_texts().items()})
        queries.update({f"{name}/{q}": t for q, t in split.queries.items()})
        qrels.update({f"{name}/{q}": {f"{name}/{d}": g for d, g in j.items()} for q, j in split.qrels.items()})
        pools[name] = [f"{name}/{i}" for i in split.corpus]
    judged = {d for q, j in qrels.items() if q.startswith("scifact/") for d, g in j.items() if g > 0}
    others = [d for d in pools["scifact"] if d not in judged]
    rng.shuffle(others)
    if scifact_docs < len(judged):
        raise ValueError(f"--scifact-docs {scifact_docs} is below the {len(judged)} documents SciFact's queries judge.")
    kept = judged | set(others[: scifact_docs - len(judged)])
    base = [d for d in pools["scifact"] if d in kept]
    appended = round(STEPS[-1] * len(base))
    held_back = others[scifact_docs - len(judged) :][:appended]
    med = rng.sample(pools["med"], min(appended, len(pools["med"])))
    if min(len(held_back), len(med)) < appended:
        raise ValueError(
            f"the last step appends {appended} documents: SciFact or MED has too few; lower --scifact-docs."
        )
    return MixingData(texts, queries, qrels, base, {"scifact": held_back, "med": med})


def write_corpus(path: Path, data: MixingData, ids: list[str]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"_id": i, "text": data.texts[i]}) + "\n" for i in ids)
    return path


def stored(folder: Path) -> tuple[list[str], np.ndarray, torch.Tensor | None]:
    """The ids and embeddings a folder's live version holds, and its context vectors."""
    manifest = read_manifest(folder)
    ids, vectors = [], []
    for entry in manifest["shards"]:
        shard_ids, shard_vectors = read_shard(folder / entry["file"], entry["sha256"])
        ids += shard_ids
        vectors.append(shard_vectors)
    context = read_context_file(context_path(folder, manifest)).vectors if manifest["context"] else None
    return ids, np.concatenate(vectors), None if context is None else torch.as_tensor(context)


def score(data: MixingData, queries: dict[str, np.ndarray], doc_ids: list[str], docs: np.ndarray) -> dict:
    """NDCG@10 of each query set over the whole corpus ``doc_ids``, on the judged documents present (a query
    with none present is not scored); ``macro``: the mean of the two sets."""
    present, out = set(doc_ids), {}
    position = {q: row for row, q in enumerate(data.queries)}
    for query_set in QUERY_SETS:
        qids = [q for q in data.query_ids(query_set) if any(d in present for d in data.qrels[q])]
        qrels = {q: {d: g for d, g in data.qrels[q].items() if d in present} for q in qids}
        rows = [position[q] for q in qids]
        if not qids:
            out[query_set], out[f"{query_set}_queries"] = None, 0
            continue
        value, _ = ndcg_at_k(torch.as_tensor(queries["vectors"][rows]), torch.as_tensor(docs), qids, doc_ids, qrels)
        out[query_set], out[f"{query_set}_queries"] = round(100 * value, 2), len(qids)
    values = [out[s] for s in QUERY_SETS if out[s] is not None]
    out["macro"] = round(sum(values) / len(values), 2) if values else None
    return out


def encode_queries(model, data: MixingData, context: torch.Tensor, batch_size: int) -> dict[str, np.ndarray]:
    vectors = model.encode_query(
        list(data.queries.values()), context_vectors=context, batch_size=batch_size, show_progress_bar=False
    )
    return {"vectors": np.asarray(vectors, dtype=np.float32)}


def fresh_scores(model, data, corpus: Path, chain: Path, work: Path, seed: int, batch_size: int) -> dict:
    """(b): a copy of the chain's folder given a fresh context sampled from the mixed corpus (same J, seed)."""
    copy = work / "fresh"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(chain, copy)
    recontextualize_corpus(model, corpus, copy, seed=seed, batch_size=batch_size, index="none", show_progress_bar=False)
    ids, docs, context = stored(copy)
    result = score(data, encode_queries(model, data, context, batch_size), ids, docs)
    shutil.rmtree(copy)
    return result


def run_seed(model, data: MixingData, seed: int, work: Path, batch_size: int) -> list[dict]:
    """Both chains under one context seed: a row per step (step 0 is the base corpus)."""
    work = work / f"seed{seed}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    base_dir = work / "base"
    base_corpus = write_corpus(work / "base.jsonl", data, data.base)
    embed_corpus(model, base_corpus, base_dir, seed=seed, batch_size=batch_size, show_progress_bar=False)
    ids, docs, context = stored(base_dir)
    old_queries = encode_queries(model, data, context, batch_size)
    base_row = {"seed": seed, "mix": "none", "fraction": 0.0, "added": 0, "rows": len(ids)}
    base_row.update(drift=corpus_drift(base_dir).percent, old=score(data, old_queries, ids, docs))
    rows = [base_row]
    for mix in MIXES:
        chain = work / f"chain-{mix}"
        shutil.copytree(base_dir, chain)
        for fraction in STEPS:
            started = time.perf_counter()
            added = data.added[mix][: round(fraction * len(data.base))]
            corpus = write_corpus(work / f"{mix}-{fraction:.2f}.jsonl", data, data.base + added)
            update_corpus(model, corpus, chain, batch_size=batch_size, show_progress_bar=False)
            ids, docs, _ = stored(chain)
            row = {"seed": seed, "mix": mix, "fraction": fraction, "added": len(added), "rows": len(ids)}
            row.update(drift=corpus_drift(chain).percent, old=score(data, old_queries, ids, docs))
            row["fresh"] = fresh_scores(model, data, corpus, chain, work, seed, batch_size)
            row["seconds"] = round(time.perf_counter() - started, 1)
            log(f"seed {seed} {mix} +{fraction:.0%}: drift {row['drift']:.1f}, old {row['old']}, fresh {row['fresh']}")
            rows.append(row)
    return rows


def floor_rows(model, data: MixingData, batch_size: int) -> list[dict]:
    """(c): no context (J = 0, the null context), every document embedded once, scored at every step."""
    null = torch.zeros(0, model.contextual_module.hidden_size)
    everything = data.base + data.added["med"] + data.added["scifact"]
    vectors = model.encode_document(
        [data.texts[i] for i in everything], context_vectors=null, batch_size=batch_size, show_progress_bar=False
    )
    by_id = dict(zip(everything, np.asarray(vectors, dtype=np.float32)))
    queries = encode_queries(model, data, null, batch_size)
    rows = []
    for mix, fraction in [("none", 0.0), *((m, f) for m in MIXES for f in STEPS)]:
        ids = data.base + (data.added[mix][: round(fraction * len(data.base))] if mix != "none" else [])
        rows.append(
            {"mix": mix, "fraction": fraction, "none": score(data, queries, ids, np.stack([by_id[i] for i in ids]))}
        )
    return rows


def _mean_spread(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{np.mean(values):.1f} ± {np.std(values, ddof=1):.1f}"


def table(rows: list[dict], floor: list[dict]) -> list[str]:
    """The Markdown table: per chain and step, drift and NDCG@10 (mean ± sd over seeds) of each query set with the
    old context, a fresh one, and none, and fresh minus old."""
    columns = ["appended", "drift (points)"]
    for query_set in QUERY_SETS:
        columns += [f"{query_set}: old", "fresh", "fresh - old", "J = 0"]
    lines = []
    floors = {(r["mix"], r["fraction"]): r["none"] for r in floor}
    for mix, fraction in [("none", 0.0), *((m, f) for m in MIXES for f in STEPS)]:
        at = [r for r in rows if r["mix"] == mix and r["fraction"] == fraction]
        label = "nothing (base)" if mix == "none" else f"+{fraction:.0%} {'MED' if mix == 'med' else 'SciFact'}"
        cells = [label, _mean_spread([r["drift"] for r in at])]
        for query_set in QUERY_SETS:
            old = [r["old"][query_set] for r in at]
            fresh = [r.get("fresh", r["old"])[query_set] for r in at]
            gain = [f - o for f, o in zip(fresh, old) if f is not None and o is not None]
            cells += [_mean_spread(old), _mean_spread(fresh), _mean_spread(gain) if gain else "-"]
            cells.append(_mean_spread([(floors.get((mix, fraction)) or {}).get(query_set)]))
        lines.append(cells)
    return markdown_table(columns, lines)


def tracking(rows: list[dict]) -> dict:
    """Whether fresh minus old quality tracks the drift: over every (seed, chain, step) row, per query set, the
    Pearson correlation of the drift with fresh - old NDCG@10 and the least-squares slope (NDCG points per drift
    point)."""
    out = {}
    for key in QUERY_SETS:  # the macro mean is over one set in the control chain and two in the MED chain
        pairs = [
            (r["drift"], r["fresh"][key] - r["old"][key])
            for r in rows
            if "fresh" in r and r["fresh"][key] is not None and r["old"][key] is not None
        ]
        if len(pairs) < 3:
            continue
        drift, gain = np.array(pairs).T
        slope = float(np.polyfit(drift, gain, 1)[0]) if np.ptp(drift) > 0 else None
        r = float(np.corrcoef(drift, gain)[0, 1]) if np.ptp(drift) > 0 and np.ptp(gain) > 0 else None
        out[key] = {"pearson_r": r, "slope_per_drift_point": slope, "rows": len(pairs)}
    return out


def summarize(results: dict) -> dict:
    """The table and the tracking statistics, from the measured rows."""
    results["table"] = table(results["rows"], results["floor"])
    results["tracking"] = tracking(results["rows"])
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", help="a contextual cde_st model folder")
    parser.add_argument("--work-dir", type=Path)
    parser.add_argument("--summarize", action="store_true", help="only recompute the table of --out's rows")
    parser.add_argument("--scifact", type=Path, default=DATA / "scifact")
    parser.add_argument("--med", type=Path, default=DATA / "med")
    parser.add_argument("--scifact-docs", type=int, default=800, help="the base corpus (judged documents included)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-seq-length", type=int, default=None, help="default: the model's")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--time-budget", type=float, default=None, help="seconds; a seed that would not fit is skipped")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.summarize:
        if not args.out.is_file():
            raise SystemExit(f"error: {args.out} not found: run the benchmark first.")
        results = summarize(json.loads(args.out.read_text(encoding="utf-8")))
        write_json(args.out, results)
        print("\n".join(results["table"]), json.dumps(results["tracking"], indent=1), sep="\n")
        return results
    if args.model is None or args.work_dir is None:
        raise SystemExit("error: give MODEL and --work-dir (or --summarize).")
    from cde_st import ContextualSentenceTransformer

    started = time.perf_counter()
    for folder in (args.scifact, args.med):
        if not folder.is_dir():
            raise SystemExit(f"error: {folder} not found (the shared data: ../shared/data/README.md).")
    model = ContextualSentenceTransformer(args.model)
    model.eval()
    if args.max_seq_length:
        model.max_seq_length = args.max_seq_length
    data = load_mixing_data(args.scifact, args.med, args.scifact_docs)
    results = {
        "command": command_line(argv and [sys.argv[0], *argv]),
        "model": str(args.model),
        "context_size": model.context_size,
        "max_seq_length": model.max_seq_length,
        "base_documents": len(data.base),
        "steps": list(STEPS),
        "seeds_run": [],
        "rows": [],
    }
    results["floor"] = floor_rows(model, data, args.batch_size)
    per_seed = []
    for seed in args.seeds:
        spent = time.perf_counter() - started
        if args.time_budget and per_seed and spent + max(per_seed) > args.time_budget:
            log(f"seed {seed} skipped: {spent:.0f} s spent, a seed takes about {max(per_seed):.0f} s")
            continue
        seed_started = time.perf_counter()
        results["rows"] += run_seed(model, data, seed, args.work_dir, args.batch_size)
        per_seed.append(time.perf_counter() - seed_started)
        results["seeds_run"].append(seed)
        results.update(environment=environment(), seconds=round(time.perf_counter() - started))
        write_json(args.out, summarize(results))
    print("\n".join(results.get("table", [])))
    return results


if __name__ == "__main__":
    main()
