"""The four-corpus tables (docs/RESULTS.md, "Four retrieval corpora"), read from what the drivers wrote:

- ``runs/eval-cmp/NAME/summary/*.csv`` (``corpus_comparison.sh``): one row per model, seed and J;
- ``runs/centering/*.json`` (``centering_baseline.py --prompts on``): the model as scored there ("plain") and
  centred on its corpus mean;
- ``runs/eval-cmp-table2/NAME/summary/*.csv`` (``TABLE2=1``): the five Table-2 tasks, which with SciFact make the
  six-task average.

    python benchmarks/quality/corpus_table.py --runs runs

Prints every measured row (NDCG@10 per corpus and the mean of four), then each row family's mean and standard
deviation over its seeds, then the six-task rows.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

TASKS = ("scifact", "med", "cacm", "lisa")
TABLE2 = ("stsbenchmark", "sickr", "biosses", "banking77", "twentynewsgroups")


def eval_rows(runs: Path, folder: str = "eval-cmp", tasks: tuple[str, ...] = TASKS) -> dict[tuple[str, str], dict]:
    """{(family, seed): {task: score}} from the eval kit's summaries; family is NAME without its seed plus J."""
    rows: dict[tuple[str, str], dict[str, float]] = {}
    for path in sorted(p for p in runs.glob(f"{folder}/*/summary/*.csv") if not p.name.endswith(".sweep.csv")):
        name = path.parts[-3]
        match = re.fullmatch(r"(.+?)(?:-s(\d+))?", name)
        family, seed = match.group(1), match.group(2) or "-"
        with path.open() as handle:
            for record in csv.DictReader(handle):
                if record["task"] in tasks:
                    key = (f"{family} J={record['context_size']}", seed)
                    rows.setdefault(key, {})[record["task"]] = float(record["score"])
    return rows


def centering_rows(runs: Path) -> dict[tuple[str, str], dict[str, float]]:
    """{(family, seed): {task: score}} from centering_baseline.py outputs (mean over its context samples)."""
    rows: dict[tuple[str, str], dict[str, float]] = {}
    for path in sorted(runs.glob("centering/*.json")):
        match = re.fullmatch(r"(?:cmp-)?(.+?)-s(\d+)(.*)", path.stem)
        family, seed = match.group(1) + match.group(3), match.group(2)
        for task, scores in json.loads(path.read_text())["scores"].items():
            for variant, values in scores.items():
                rows.setdefault((f"{family} {variant}", seed), {})[task] = statistics.mean(values)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="runs", help="the folder the drivers wrote to")
    args = parser.parse_args()
    retrieval = eval_rows(Path(args.runs))
    rows = {**retrieval, **centering_rows(Path(args.runs))}
    print("| row | seed | SciFact | MED | CACM | LISA | mean of four |\n|---|---|---|---|---|---|---|")
    families: dict[str, list[float]] = defaultdict(list)
    for (family, seed), scores in sorted(rows.items()):
        if all(task in scores for task in TASKS):
            mean = statistics.mean(scores[task] for task in TASKS)
            families[family].append(mean)
            cells = " | ".join(f"{scores[task]:.2f}" for task in TASKS)
            print(f"| {family} | {seed} | {cells} | {mean:.2f} |")
    print("\n| row | seeds | mean of four: mean | std |\n|---|---|---|---|")
    for family, means in sorted(families.items()):
        spread = f"{statistics.stdev(means):.2f}" if len(means) > 1 else "-"
        print(f"| {family} | {len(means)} | {statistics.mean(means):.2f} | {spread} |")
    six = (*TABLE2, "scifact")
    print("\n| row | seed | STSB | SICK-R | BIOSSES | Banking77 | 20NG | SciFact | 6-task avg |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key, scores in sorted(eval_rows(Path(args.runs), "eval-cmp-table2", TABLE2).items()):
        if "scifact" in retrieval.get(key, {}):  # the sixth task: SciFact of the same model and J
            scores["scifact"] = retrieval[key]["scifact"]
        if all(task in scores for task in six):
            cells = " | ".join(f"{scores[task]:.2f}" for task in six)
            print(f"| {key[0]} | {key[1]} | {cells} | {statistics.mean(scores[t] for t in six):.2f} |")


if __name__ == "__main__":
    main()
