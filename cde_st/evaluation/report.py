"""Summaries of an evaluation run: per-task main scores, per-type averages as in the CDE paper's Table 2, and the
context-size sweep (table + plot).

Scores are mteb main scores x 100, taken on the ``test`` split when a task has one (else its first evaluation
split) and averaged over the task's subsets, as the MTEB leaderboard does. The ``Avg`` column is the mean over
all tasks (MTEB's average), not the mean of the type averages.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

#: Table 2 columns of the CDE paper and the mteb task types each averages.
TABLE2_COLUMNS: tuple[tuple[str, frozenset[str]], ...] = (
    ("Class.", frozenset({"Classification", "MultilabelClassification"})),
    ("Clust.", frozenset({"Clustering"})),
    ("PairClass.", frozenset({"PairClassification"})),
    ("Rerank", frozenset({"Reranking", "InstructionReranking"})),
    ("Retrieval", frozenset({"Retrieval", "InstructionRetrieval"})),
    ("STS", frozenset({"STS"})),
    ("Summ.", frozenset({"Summarization"})),
)


@dataclass(frozen=True)
class TaskScore:
    """One task's main score (x100) in one run (context mode, size J, seed)."""

    task: str
    task_type: str
    metric: str
    split: str
    score: float
    context: str
    context_size: int
    seed: int

    @property
    def run(self) -> str:
        return run_label(self.context, self.context_size)

    def to_dict(self) -> dict:
        return asdict(self)


def run_label(context: str, size: int) -> str:
    """Label of a run: ``J=64`` (corpus context), ``random J=64``, ``no context``."""
    if context == "none":
        return "no context"
    return f"J={size}" if context == "corpus" else f"{context} J={size}"


def scores_from_result(
    task_result, *, task_type: str, metric: str, context: str, context_size: int, seed: int
) -> TaskScore:
    """The :class:`TaskScore` of an ``mteb`` ``TaskResult`` (main score, test split preferred, subsets averaged)."""
    splits = list(task_result.scores)
    split = "test" if "test" in splits else splits[0]
    entries = task_result.scores[split]
    values = [float(entry["main_score"]) for entry in entries]
    return TaskScore(
        task=task_result.task_name,
        task_type=task_type,
        metric=metric,
        split=split,
        score=100.0 * sum(values) / len(values),
        context=context,
        context_size=context_size,
        seed=seed,
    )


def type_averages(scores: Sequence[TaskScore]) -> dict[str, float | None]:
    """Table 2 row of one run: the mean score of each task-type column (None if no task) and ``Avg``."""
    row: dict[str, float | None] = {}
    for column, types in TABLE2_COLUMNS:
        values = [s.score for s in scores if s.task_type in types]
        row[column] = sum(values) / len(values) if values else None
    row["Avg"] = sum(s.score for s in scores) / len(scores) if scores else None
    return row


def _fmt(value: float | None) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"


def _runs(scores: Sequence[TaskScore]) -> list[str]:
    return list(dict.fromkeys(s.run for s in scores))


def _markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def summary_markdown(scores: Sequence[TaskScore], title: str) -> str:
    """Markdown summary: per-task scores (a column per run) and the Table 2 per-type averages (a row per run)."""
    runs = _runs(scores)
    by_key = {(s.task, s.run): s for s in scores}
    tasks = list(dict.fromkeys(s.task for s in scores))
    first = {s.task: s for s in scores}
    task_rows = [
        [task, first[task].task_type, first[task].metric, first[task].split]
        + [_fmt(by_key[(task, run)].score) if (task, run) in by_key else "–" for run in runs]
        for task in tasks
    ]
    columns = [c for c, _ in TABLE2_COLUMNS] + ["Avg"]
    type_rows = []
    for run in runs:
        averages = type_averages([s for s in scores if s.run == run])
        type_rows.append([run] + [_fmt(averages[c]) for c in columns])
    return (
        "\n\n".join(
            [
                f"# {title}",
                "Main scores x100 (test split; subsets averaged).",
                _markdown_table(["task", "type", "metric", "split", *runs], task_rows),
                "Per-type averages (CDE paper, Table 2); Avg = mean over all tasks.",
                _markdown_table(["run", *columns], type_rows),
            ]
        )
        + "\n"
    )


def write_summary(scores: Sequence[TaskScore], path_stem: str | Path, title: str, model: str) -> dict[str, Path]:
    """Write ``<stem>.md`` and ``<stem>.csv`` (long format: one row per task and run, then the per-type averages
    as rows with ``task_type = "average"``). Returns the paths."""
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    md_path, csv_path = stem.with_suffix(".md"), stem.with_suffix(".csv")
    md_path.write_text(summary_markdown(scores, title), encoding="utf-8")
    fieldnames = ["model", "run", "context", "context_size", "seed", "task", "task_type", "metric", "split", "score"]
    with csv_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fieldnames)
        writer.writeheader()
        for s in scores:
            writer.writerow({"model": model, "run": s.run, **s.to_dict(), "score": f"{s.score:.4f}"})
        for run in _runs(scores):
            run_scores = [s for s in scores if s.run == run]
            ref = run_scores[0]
            for column, value in type_averages(run_scores).items():
                if value is None:
                    continue
                writer.writerow(
                    {
                        "model": model,
                        "run": run,
                        "context": ref.context,
                        "context_size": ref.context_size,
                        "seed": ref.seed,
                        "task": column,
                        "task_type": "average",
                        "metric": "",
                        "split": "",
                        "score": f"{value:.4f}",
                    }
                )
    return {"summary_md": md_path, "summary_csv": csv_path}


def plot_sweep(scores: Sequence[TaskScore], path: str | Path, title: str) -> Path:
    """Line plot of main score against context size J, one line per task (and the average when several tasks).

    J = 0 is drawn on a symmetric-log axis so 0, 16, 64, 256, ... are evenly readable.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sizes = sorted({s.context_size for s in scores})
    tasks = list(dict.fromkeys(s.task for s in scores))
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for task in tasks:
        points = sorted((s.context_size, s.score) for s in scores if s.task == task)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=task)
    if len(tasks) > 1:
        avg = [
            sum(s.score for s in scores if s.context_size == j) / max(1, sum(s.context_size == j for s in scores))
            for j in sizes
        ]
        ax.plot(sizes, avg, marker="s", color="black", linestyle="--", label="average")
    ax.set_xscale("symlog", linthresh=max(1, min([j for j in sizes if j > 0], default=1)))
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(j) for j in sizes])
    ax.set_xlabel("context size J (documents)")
    ax.set_ylabel("main score (x100)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def sweep_markdown(scores: Sequence[TaskScore], title: str) -> str:
    """Markdown table of a context-size sweep: a row per task (plus the average), a column per J."""
    sizes = sorted({s.context_size for s in scores})
    tasks = list(dict.fromkeys(s.task for s in scores))
    by_key = {(s.task, s.context_size): s.score for s in scores}
    rows = [[task] + [_fmt(by_key.get((task, j))) for j in sizes] for task in tasks]
    if len(tasks) > 1:
        rows.append(
            ["average"] + [_fmt(sum(by_key[(t, j)] for t in tasks if (t, j) in by_key) / len(tasks)) for j in sizes]
        )
    return f"# {title}\n\n" + _markdown_table(["task", *[f"J={j}" for j in sizes]], rows) + "\n"


def write_sweep_csv(scores: Sequence[TaskScore], path: str | Path) -> Path:
    """Wide CSV of a sweep: a row per task, a column per context size J (scores x100)."""
    path = Path(path)
    sizes = sorted({s.context_size for s in scores})
    by_key = {(s.task, s.context_size): s.score for s in scores}
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["task", *[f"J={j}" for j in sizes]])
        for task in dict.fromkeys(s.task for s in scores):
            writer.writerow([task, *[f"{by_key[(task, j)]:.4f}" if (task, j) in by_key else "" for j in sizes]])
    return path
