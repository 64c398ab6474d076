"""benchmarks/quality/drift_mixing.py at a tiny size with a tiny random contextual model: the base keeps every judged
document, each chain appends its share through the update path, the fresh context is a re-sample of the mixed
corpus, and the table has a row per step; documents of another kind move the drift far more than the corpus's own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

QUALITY = Path(__file__).resolve().parents[2] / "benchmarks" / "quality"
sys.path.insert(0, str(QUALITY))
sys.path.insert(0, str(QUALITY.parent))

import drift_mixing  # noqa: E402


def _beir(folder: Path, docs: list[tuple[str, str]], queries: list[tuple[str, str, list[str]]]) -> Path:
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": i, "title": "", "text": t}) + "\n" for i, t in docs)
    )
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t, _ in queries))
    qrels = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t1" for q, _, judged in queries for d in judged]
    (folder / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n")
    return folder


def test_the_mixing_table_at_a_tiny_size(make_tiny_cde, tmp_path):
    # Ids repeat across the two collections, as SciFact's and MED's do: the driver must keep them apart.
    sci = [(str(i), f"cell protein {i % 9} gene expression study {i}") for i in range(60)]
    med = [(str(i), f"volcano lava eruption magma {i} basalt crater ash plume") for i in range(40)]
    sci_q = [(f"q{i}", f"protein {i} gene", [str(i), str(i + 10)]) for i in range(5)]
    med_q = [(f"q{i}", f"lava {i}", [str(i), str(i + 20)]) for i in range(4)]
    scifact, medf = _beir(tmp_path / "scifact", sci, sci_q), _beir(tmp_path / "med", med, med_q)
    model_dir = tmp_path / "model"
    make_tiny_cde(context_size=8).save(str(model_dir))
    out = tmp_path / "drift_mixing.json"
    argv = [str(model_dir), "--work-dir", str(tmp_path / "work"), "--scifact", str(scifact), "--med", str(medf)]
    results = drift_mixing.main([*argv, "--scifact-docs", "30", "--seeds", "0", "--out", str(out)])

    assert json.loads(out.read_text())["seeds_run"] == [0] == results["seeds_run"]
    data = drift_mixing.load_mixing_data(scifact, medf, 30)
    assert len(data.base) == 30 and {f"scifact/{d}" for _, _, j in sci_q for d in j} <= set(data.base)
    assert not set(data.added["scifact"]) & set(data.base) and len(data.added["med"]) == 15
    rows = {(r["mix"], r["fraction"]): r for r in results["rows"]}
    assert len(rows) == 1 + 2 * len(drift_mixing.STEPS)
    for (mix, fraction), row in rows.items():
        assert row["rows"] == 30 + round(fraction * 30)
        if mix != "none":
            assert row["fresh"]["scifact_queries"] == 5 and row["old"]["med_queries"] == row["fresh"]["med_queries"]
    assert rows["none", 0.0]["old"]["med"] is None  # no MED document yet: its queries are not scored
    assert rows["med", 0.5]["drift"] > rows["scifact", 0.5]["drift"] + 10
    assert len(results["table"]) == 2 + len(rows) and len(results["floor"]) == len(rows)
    assert results["tracking"]["scifact"]["rows"] == 2 * len(drift_mixing.STEPS)
    assert results["tracking"]["med"]["rows"] == len(drift_mixing.STEPS)  # MED queries score in the MED chain only

    again = drift_mixing.main(["--summarize", "--out", str(out)])
    assert again["table"] == results["table"] and again["tracking"] == results["tracking"]
