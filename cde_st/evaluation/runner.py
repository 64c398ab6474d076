"""One function to evaluate a model on mteb tasks with per-task corpus context: :func:`evaluate_model`.

``eval/run_mteb.py`` and ``cde-st-eval`` are thin command lines over it (the trainer scores with the in-training
evaluators of :mod:`~cde_st.evaluation.evaluators` instead). For each context size J of the run, a
:class:`~cde_st.evaluation.wrapper.ContextualEncoderWrapper` (task prefixes, the context plan of
:mod:`~cde_st.evaluation.pools`) is handed to ``mteb.evaluate`` task by task. Per task/subset/split the context is
sampled from the task's own pool, seeded and without replacement, prefixed with the task's document prefix and
embedded once; mteb's evaluator scores it (``context="random"``: from foreign documents,
:mod:`~cde_st.evaluation.random_corpus`). Tasks come from :mod:`~cde_st.evaluation.tasks`, the model from
:mod:`~cde_st.model_loading` and its result name from :mod:`~cde_st.evaluation.models`, cached results are checked
by :mod:`~cde_st.evaluation.provenance` and summaries written by :mod:`~cde_st.evaluation.report`.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from cde_st.context import check_seed
from cde_st.evaluation.model_context import context_sizes, is_contextual_model
from cde_st.evaluation.models import build_model_meta, default_model_name, weights_revision
from cde_st.evaluation.pools import CONTEXT_MODES, ContextPlan
from cde_st.evaluation.prefixes import TaskPrefixes
from cde_st.evaluation.provenance import check_cached, record_provenance, task_provenance
from cde_st.evaluation.random_corpus import foreign_pool
from cde_st.evaluation.report import (
    TaskScore,
    plot_sweep,
    run_label,
    scores_from_result,
    summary_markdown,
    sweep_markdown,
    write_summary,
    write_sweep_csv,
)
from cde_st.evaluation.tasks import (
    TaskDataError,
    UnknownTaskError,
    load_task_data,
    resolve_task,
)
from cde_st.evaluation.wrapper import ContextualEncoderWrapper
from cde_st.model_loading import load_model

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_OUTPUT_DIR",
    "EvaluationReport",
    "RunResult",
    "TaskDataError",
    "UnknownTaskError",
    "evaluate_model",
    "load_model",
    "resolve_task",
]


#: Where :func:`evaluate_model` and ``cde-st-eval`` write by default (mteb results and summaries beneath it).
DEFAULT_OUTPUT_DIR = "outputs/mteb"


# ----------------------------------------------------------------------------------------------------------------
# Results


@dataclass
class RunResult:
    """The results of one context setting (mode, size J, seed) on all tasks."""

    context: str
    context_size: int
    seed: int
    experiment_kwargs: dict[str, Any]
    scores: list[TaskScore] = field(default_factory=list)
    task_results: list[Any] = field(default_factory=list)
    context_log: list[dict[str, Any]] = field(default_factory=list)
    #: With ``overwrite=False``: per task, whether its cached result was reused or re-run, and why.
    cache_notes: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return run_label(self.context, self.context_size)


@dataclass
class EvaluationReport:
    """What :func:`evaluate_model` returns: one :class:`RunResult` per context size, and the files written."""

    model_name: str
    revision: str
    runs: list[RunResult]
    files: dict[str, Path] = field(default_factory=dict)
    #: Per task, the scoring rules that are not visible in the scores, e.g. ``{"identical_ids": "keep ... (auto, from
    #: the texts: 0 of 30 query ids that are also corpus ids have the query text in that document ...)"}``.
    task_settings: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def scores(self) -> list[TaskScore]:
        return [s for run in self.runs for s in run.scores]

    def score(self, task: str, context_size: int | None = None) -> float:
        """Main score x100 of ``task`` (in the run with ``context_size``; the only/first run by default)."""
        for run in self.runs:
            if context_size is None or run.context_size == context_size:
                for s in run.scores:
                    if s.task == task:
                        return s.score
        raise KeyError(f"No score for task {task!r} (context size {context_size}).")

    def summary(self) -> str:
        """The Markdown summary table (per-task scores and Table 2 per-type averages), then the scoring rules."""
        return summary_markdown(self.scores, f"MTEB summary: {self.model_name}") + self.settings_markdown()

    def settings_markdown(self) -> str:
        """The per-task scoring rules (:attr:`task_settings`) as a Markdown list ("" when there are none)."""
        lines = [
            f"- {task}: {key}: {value}" for task, rules in self.task_settings.items() for key, value in rules.items()
        ]
        return "\n## Scoring rules\n\n" + "\n".join(lines) + "\n" if lines else ""


# ----------------------------------------------------------------------------------------------------------------
# The run


def evaluate_model(
    model: Any,
    tasks: Sequence[Any],
    *,
    data_dir: str | Path | None = None,
    context_size: int | Sequence[int] | None = None,
    context_seed: int = 0,
    context: str = "corpus",
    random_corpus: str | Path | Sequence[str] | None = None,
    prefixes: bool | None = None,
    prefix_overrides: Mapping[str, str] | None = None,
    output_dir: str | Path | None = DEFAULT_OUTPUT_DIR,
    batch_size: int = 64,
    model_name: str | None = None,
    revision: str | None = None,
    eval_splits: Sequence[str] | None = None,
    overwrite: bool = True,
    show_progress_bar: bool = True,
    device: str | None = None,
    max_seq_length: int | None = None,
    identical_ids: str = "auto",
    backend: str = "torch",
    onnx_file: str | None = None,
) -> EvaluationReport:
    """Evaluate a (contextual or plain) sentence-transformers model on mteb tasks and local task folders.

    Args:
        model: a ``SentenceTransformer`` (e.g. ``ContextualSentenceTransformer``), or a model folder / hub id (loaded
            on ``device``, with ``backend`` and ``onnx_file``: :func:`~cde_st.model_loading.load_model`).
        tasks: mteb task names, local task folders, names of folders under ``data_dir`` (the root of local task
            folders, ``<data_dir>/<type>/<name>``, see :mod:`cde_st.evaluation.local_tasks`), or mteb task objects.
        context_size: J, or several J for a sweep (contextual models only; default: the model's); 0: no context.
        context_seed: seed of the context sampling.
        context: ``"corpus"`` (the task's own pool), ``"random"`` (documents from another corpus: ``random_corpus``,
            texts, a ``.txt`` / ``.jsonl`` file or a task, else the pools of the *other* tasks of this run) or
            ``"none"`` (null context).
        prefixes: apply the task prefixes (default: on for contextual models, off for plain ones, which then use their
            own prompts as mteb does). ``prefix_overrides``: prefixes by role (``query``, ``document``,
            ``classification``, ``clustering``, ``symmetric``); implies ``prefixes=True`` unless it is False.
        output_dir: the one folder a run writes to: mteb result JSON (also mteb's result cache) and ``summary/``;
            default :data:`DEFAULT_OUTPUT_DIR` (``outputs/mteb``, git-ignored); ``None`` writes nothing.
        batch_size, show_progress_bar, max_seq_length: encoding options (``max_seq_length``: default the model's).
        model_name / revision: how results name the model (defaults: ``local/<folder>`` or the hub id, and a hash of
            the weights).
        eval_splits: evaluate these splits instead of the tasks' defaults.
        overwrite: re-run tasks whose results exist in ``output_dir`` (False: reuse a cached result only when it was
            computed on the same data, context documents and scoring settings, else re-run with a warning saying why;
            ``RunResult.cache_notes`` records which).
        identical_ids: retrieval: whether a corpus document whose id is the query's own id counts among its results:
            ``"auto"`` (the task's own rule, :mod:`~cde_st.evaluation.identical_ids`), ``"ignore"`` or ``"keep"``;
            the rule used and why: :attr:`EvaluationReport.task_settings`.

    Returns an :class:`EvaluationReport` (scores per run and task, mteb ``TaskResult`` objects, files written).

    Example:
        >>> report = evaluate_model(model, ["scifact"], data_dir="path/to/data", context_size=[0, 64])  # doctest: +SKIP
        >>> report.score("scifact", context_size=64)  # doctest: +SKIP
    """
    resolved = _checked_tasks(tasks, context, context_seed, data_dir, eval_splits, identical_ids)
    model, model_name, revision = _named_model(
        model, max_seq_length, model_name, revision, device=device, backend=backend, onnx_file=onnx_file
    )
    wrappers, runs = _plan_runs(
        model, resolved, model_name, revision, context, context_size, context_seed, random_corpus, data_dir,
        prefixes, prefix_overrides, identical_ids,
    )  # fmt: skip
    task_settings = _evaluate_tasks(
        resolved, wrappers, runs, data_dir, output_dir, overwrite, batch_size, show_progress_bar, model_name
    )
    return _report(model_name, revision, runs, task_settings, output_dir)


def _checked_tasks(
    tasks: Sequence[Any],
    context: str,
    context_seed: int,
    data_dir: Any,
    eval_splits: Sequence[str] | None,
    identical_ids: str,
) -> list[Any]:
    """The arguments checked and the tasks resolved before the model is loaded: a mistake fails fast."""
    if context not in CONTEXT_MODES:
        raise ValueError(f"Unknown context mode {context!r}; choose one of {CONTEXT_MODES}.")
    check_seed(context_seed, "context_seed (--context-seed)")
    resolved = [resolve_task(t, data_dir, eval_splits, identical_ids) for t in tasks]
    names = [t.metadata.name for t in resolved]
    if len(set(names)) != len(names):
        raise ValueError(f"Duplicate tasks in {names}.")
    return resolved


def _named_model(
    model: Any, max_seq_length: int | None, model_name: str | None, revision: str | None, **options: Any
) -> tuple[Any, str, str]:
    """The model (loaded when given by name, with ``options``: :func:`load_model`), with this run's token limit, and
    the name and revision results give it (``model_name`` / ``revision`` when given)."""
    spec = model if isinstance(model, (str, Path)) else None
    if spec is not None:
        model = load_model(model, **options)
    if max_seq_length is not None:  # e.g. score models trained at different lengths at one length
        model.max_seq_length = max_seq_length
    return model, model_name or default_model_name(model, spec), revision or weights_revision(model)


def _plan_runs(
    model: Any,
    resolved: list[Any],
    model_name: str,
    revision: str,
    context: str,
    context_size: int | Sequence[int] | None,
    context_seed: int,
    random_corpus: Any,
    data_dir: Any,
    prefixes: bool | None,
    prefix_overrides: Mapping[str, str] | None,
    identical_ids: str,
) -> tuple[list[ContextualEncoderWrapper], list[RunResult]]:
    """One encoder wrapper (context plan, prefixes, mteb model meta) and one empty result per context size J."""
    contextual = is_contextual_model(model)
    sizes = context_sizes(model, contextual, context, context_size)
    mode = context if contextual else "none"
    use_prefixes = prefixes if prefixes is not None else (contextual or bool(prefix_overrides))
    task_prefixes = TaskPrefixes().with_overrides(prefix_overrides) if use_prefixes else None
    random_pool, random_name = None, None
    if mode == "random":
        random_pool, random_name = foreign_pool(resolved, random_corpus, data_dir, max(sizes), context_seed)
    runs: list[RunResult] = []
    wrappers = []
    for size in sizes:
        kwargs: dict[str, Any] = {"context": mode, "context_size": size, "context_seed": context_seed}
        if mode == "random":
            kwargs["random_corpus"] = random_name
        if task_prefixes is not None:
            kwargs["prefixes"] = "nomic" if task_prefixes == TaskPrefixes() else task_prefixes.to_dict()
        elif contextual:
            kwargs["prefixes"] = "off"
        if identical_ids != "auto":
            kwargs["identical_ids"] = identical_ids
        plan = ContextPlan(mode=mode, size=size, seed=context_seed, random_pool=random_pool) if contextual else None
        meta = build_model_meta(model, name=model_name, revision=revision, experiment_kwargs=kwargs)
        wrappers.append(ContextualEncoderWrapper(model, plan=plan, prefixes=task_prefixes, model_meta=meta))
        runs.append(RunResult(context=mode, context_size=size, seed=context_seed, experiment_kwargs=kwargs))
    return wrappers, runs


def _evaluate_tasks(
    resolved: list[Any],
    wrappers: list[ContextualEncoderWrapper],
    runs: list[RunResult],
    data_dir: Any,
    output_dir: str | Path | None,
    overwrite: bool,
    batch_size: int,
    show_progress_bar: bool,
    model_name: str,
) -> dict[str, dict[str, str]]:
    """Every task under every run (its data loaded once per task); fills the runs, returns the tasks' rules."""
    # mteb is imported on use: importing it takes seconds, and this module's other names do not need it
    import mteb

    cache = mteb.ResultCache(cache_path=str(Path(output_dir).expanduser())) if output_dir is not None else None
    encode_kwargs = {"batch_size": batch_size, "show_progress_bar": show_progress_bar}
    task_settings: dict[str, dict[str, str]] = {}
    try:
        tasks_bar = tqdm(resolved, desc="Tasks", unit="task", disable=not show_progress_bar or len(resolved) < 2)
        for number, task in enumerate(tasks_bar, start=1):
            preloaded = task.data_loaded
            load_task_data(task, data_dir)
            if getattr(task, "identical_ids_rule", None):
                task_settings[task.metadata.name] = {"identical_ids": task.identical_ids_rule}
            for wrapper, run in zip(wrappers, runs):
                if wrapper.plan is not None:
                    wrapper.plan.register(task)
                logger.info(
                    "Task %d of %d: evaluating %s on %s (%s)",
                    number,
                    len(resolved),
                    model_name,
                    task.metadata.name,
                    run.label,
                )
                _evaluate_task(mteb, task, wrapper, run, cache, overwrite, encode_kwargs)
            if not preloaded:
                task.unload_data()
    finally:
        for wrapper in wrappers:
            wrapper.release()
    for wrapper, run in zip(wrappers, runs):
        run.context_log = wrapper.context_log
    return task_settings


def _evaluate_task(
    mteb: Any,
    task: Any,
    wrapper: ContextualEncoderWrapper,
    run: RunResult,
    cache: Any,
    overwrite: bool,
    encode_kwargs: dict[str, Any],
) -> None:
    """One task under one run (reusing a cached result only when its provenance matches); appends to ``run``."""
    provenance = task_provenance(task, wrapper) if cache is not None else None
    strategy = "always"
    if cache is not None and not overwrite:
        reuse, note = check_cached(cache, wrapper.mteb_model_meta, task.metadata.name, provenance)
        strategy = "only-missing" if reuse else "always"
        if note:
            run.cache_notes[task.metadata.name] = note
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*superseded.*")
        result = mteb.evaluate(
            wrapper,
            task,
            cache=cache,
            overwrite_strategy=strategy,
            encode_kwargs=dict(encode_kwargs),
            show_progress_bar=False,
            co2_tracker=False,
        )
    wrapper.release()
    if result.exceptions:
        raise RuntimeError(f"Task {task.metadata.name} failed: {result.exceptions[0].exception}")
    if cache is not None:
        record_provenance(cache, wrapper.mteb_model_meta, provenance, merge=strategy != "always")
    task_result = result.task_results[0]
    run.task_results.append(task_result)
    run.scores.append(
        scores_from_result(
            task_result,
            task_type=task.metadata.type,
            metric=task.metadata.main_score,
            context=run.context,
            context_size=run.context_size,
            seed=run.seed,
        )
    )


def _report(
    model_name: str, revision: str, runs: list[RunResult], task_settings: dict[str, dict[str, str]], output_dir: Any
) -> EvaluationReport:
    """The run's :class:`EvaluationReport`, its summaries written under ``output_dir`` (None: nothing written)."""
    report = EvaluationReport(model_name=model_name, revision=revision, runs=runs, task_settings=task_settings)
    if output_dir is not None:
        report.files = _write_reports(report, Path(output_dir).expanduser())
    return report


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def _write_reports(report: EvaluationReport, output_dir: Path) -> dict[str, Path]:
    first = report.runs[0]
    sizes = [r.context_size for r in report.runs]
    size_tag = "-".join(str(j) for j in sizes)
    tag = f"{_slug(report.model_name)}__{first.context}_J{size_tag}_seed{first.seed}"
    if "prefixes" in first.experiment_kwargs:
        prefixes = first.experiment_kwargs["prefixes"]
        tag += f"_prefixes-{prefixes if isinstance(prefixes, str) else 'custom'}"
    title = f"MTEB summary: {report.model_name} @ {report.revision} (context={first.context}, seed={first.seed})"
    files = write_summary(report.scores, output_dir / "summary" / tag, title, report.model_name)
    if report.task_settings:
        with files["summary_md"].open("a", encoding="utf-8") as handle:
            handle.write(report.settings_markdown())
    context_path = output_dir / "summary" / f"{tag}.contexts.json"
    context_path.write_text(
        json.dumps({r.label: r.context_log for r in report.runs}, indent=1, ensure_ascii=False), encoding="utf-8"
    )
    files["contexts"] = context_path
    if len(report.runs) > 1:
        sweep_title = f"Context-size sweep: {report.model_name} (context={first.context}, seed={first.seed})"
        sweep_md = output_dir / "summary" / f"{tag}.sweep.md"
        sweep_md.write_text(sweep_markdown(report.scores, sweep_title), encoding="utf-8")
        files["sweep_md"] = sweep_md
        files["sweep_csv"] = write_sweep_csv(report.scores, output_dir / "summary" / f"{tag}.sweep.csv")
        files["sweep_png"] = plot_sweep(report.scores, output_dir / "summary" / f"{tag}.sweep.png", sweep_title)
    return files
