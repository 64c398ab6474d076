"""Training pairs: every ``train_data`` source read into one ``Dataset(query, document, domain)``.

Sources (``TrainConfig.train_data``, several may be combined):

- a ``.jsonl`` / ``.jsonl.gz`` file of ``{"query": ..., "document": ..., "domain": ...}`` rows (``domain``
  optional: the file name), or a folder of such files (one file per domain);
- ``beir:FOLDER[:split]``: the (query, relevant document) pairs of a BEIR folder's qrels (default split: train);
- ``hub:NAME[:config]``: the first two text columns of a Hugging Face dataset's train split;
- ``builtin:tiny``: 64 generated pairs in two domains, for the tiny smoke-test preset.

Files are read with :mod:`cde_st.data` (the one validating reader: errors name the file and line).
"""

from __future__ import annotations

import glob
import logging
import os
from pathlib import Path

from datasets import Dataset, concatenate_datasets, load_dataset

from cde_st.data import DataError, column, iter_lines, load_beir, read_jsonl_lines
from cde_st.training.config import TrainConfig, TrainConfigError

logger = logging.getLogger(__name__)

# What `train_data` accepts, as the error of a run without training data says it.
TRAIN_DATA_HELP = (
    "a folder or .jsonl(.gz) file of query/document pairs, a BEIR folder as beir:FOLDER[:split], or hub:owner/name"
)

# The package's one data error (cde_st.data.DataError), under the name this module's callers have imported it by.
TrainingDataError = DataError


class NoTrainingDataError(TrainConfigError):
    """The config names no training data (``train_data`` is empty): the mini and paper presets bring none."""


def tiny_pairs() -> list[dict[str, str]]:
    """The built-in pairs of ``builtin:tiny``: 64 generated (query, document) pairs on 8 topics, in two domains."""
    topics = ["rain", "stocks", "proteins", "glaciers", "courts", "coffee", "music", "networks"]
    rows = []
    for i in range(64):
        topic = topics[i % len(topics)]
        rows.append(
            {
                "query": f"question {i} about {topic}",
                "document": f"a passage number {i} explaining {topic} in some detail",
                "domain": "even" if i % 2 == 0 else "odd",
            }
        )
    return rows


def jsonl_files(source: str) -> list[str]:
    """The pair files a local ``train_data`` source stands for: the file itself, or a folder's ``*.jsonl`` and
    ``*.jsonl.gz`` files (sorted)."""
    if os.path.isdir(source):
        files = sorted(glob.glob(os.path.join(source, "*.jsonl")) + glob.glob(os.path.join(source, "*.jsonl.gz")))
        if not files:
            raise FileNotFoundError(f"No *.jsonl or *.jsonl.gz files in {source}.")
        return files
    if not os.path.exists(source):
        raise FileNotFoundError(f"Training data {source!r} does not exist.")
    return [source]


def _domain_of(path: str) -> str:
    name = os.path.basename(path)
    for suffix in (".gz", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return name


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_pairs_file(path: str) -> list[dict[str, str]]:
    """The (query, document, domain) rows of a jsonl(.gz) file, each line checked: a JSON object with string
    ``query`` and ``document`` (and, if present, ``domain``; the file name otherwise). Blank lines are skipped,
    other fields ignored, an empty file gives no rows (with a warning). A :class:`~cde_st.data.DataError` names the file
    and line of the first bad row."""
    if next(iter_lines(Path(path)), None) is None:
        logger.warning("%s holds no pairs (empty file).", path)
        return []
    default_domain = _domain_of(path)
    rows = []
    for line_no, row in read_jsonl_lines(path, ["query", "document"], optional=["domain"]):
        for key, value in row.items():  # read_jsonl_lines checked that every field is a str
            if not _encodable(value):
                bad = next(c for c in value if not _encodable(c))
                raise DataError(
                    f"{path}:{line_no}: field {key!r} holds a lone surrogate escape \\u{ord(bad):04x} (half of a "
                    "UTF-16 pair), which is not text a tokenizer can read; fix or drop the row."
                )
        for key in ("query", "document"):
            if not row[key].strip():
                raise DataError(
                    f"{path}:{line_no}: field {key!r} is empty (blank text): a pair teaches the model only when both "
                    "its query and its document hold text; fill or drop the row."
                )
        rows.append({"query": row["query"], "document": row["document"], "domain": row.get("domain", default_domain)})
    return rows


def _load_jsonl_pairs(path: str) -> Dataset:
    rows = read_pairs_file(path)
    return Dataset.from_dict(
        {
            "query": [r["query"] for r in rows],
            "document": [r["document"] for r in rows],
            "domain": [r["domain"] for r in rows],
            "source": [_domain_of(path)] * len(rows),
        }
    )


def _load_beir_pairs(folder: str, split: str = "train") -> Dataset:
    """(query, positive document) pairs from a BEIR folder's qrels (score > 0)."""
    data = load_beir(folder, split)
    docs = data.document_texts()
    rows = [
        (data.queries[q], docs[d])
        for q, rel in data.qrels.items()
        for d, score in rel.items()
        if score > 0 and q in data.queries and d in docs
    ]
    name = Path(folder).name + f"_{split}"
    return Dataset.from_dict(
        {"query": [r[0] for r in rows], "document": [r[1] for r in rows], "domain": [name] * len(rows)}
    )


def _load_hub_pairs(spec: str) -> Dataset:
    name, _, config = spec.partition(":")
    ds = load_dataset(name, config or None, split="train")
    text_columns = [c for c, f in ds.features.items() if getattr(f, "dtype", None) == "string"]
    if len(text_columns) < 2:
        raise ValueError(f"Hub dataset {spec!r} has fewer than two text columns: {list(ds.features)}.")
    ds = ds.select_columns(text_columns[:2]).rename_columns({text_columns[0]: "query", text_columns[1]: "document"})
    return ds.add_column("domain", [name] * len(ds))


def pairs_for_max_steps(pairs: Dataset, max_steps: int, batch_size: int, processes: int = 1, seed: int = 0) -> Dataset:
    """``pairs``, or a seeded sample of them when ``max_steps`` (> 0) trains on fewer: the clustered sampler embeds
    every pair it is given, so 4 steps of 8 pairs over 31k pairs would embed all 31k to train on 32.

    The sample keeps ``max_steps * batch_size * processes`` pairs plus ``batch_size - 1`` per domain: batches never
    mix domains, so each domain may end in a short batch, and with that margin the full batches (which come first in
    every epoch) cover all the steps. A ``--resume`` that changes ``max_steps`` therefore trains on another sample."""
    if max_steps is None or max_steps <= 0:
        return pairs
    domains = len(set(column(pairs, "domain"))) if "domain" in pairs.column_names else 1
    needed = max_steps * batch_size * processes + domains * (batch_size - 1)
    if needed >= len(pairs):
        return pairs
    logger.info(
        "max_steps=%d trains on %d batches of %d: using a seeded sample of %d of the %d pairs (max_steps=-1 trains "
        "on all of them)",
        max_steps,
        max_steps * processes,
        batch_size,
        needed,
        len(pairs),
    )
    return pairs.shuffle(seed=seed).select(range(needed))


def check_pairs_can_teach(pairs: Dataset, sources: list[str]) -> None:
    """A :class:`~cde_st.data.DataError` naming ``sources`` when ``pairs`` cannot teach a contextual (or any contrastive)
    model anything: the loss tells each query's document apart from the other pairs' documents, so fewer than two
    pairs, a single distinct query or document, blank texts, or every query identical to its document train to a
    loss of 0 (or a constant) and change nothing. A warning when many pairs are only a text matched with itself."""
    where = ", ".join(sources)
    n = len(pairs)
    if n < 2:
        raise DataError(
            f"{where}: only {n} pair{'s' if n != 1 else ''} to train on: the loss tells a query's document apart "
            "from the other pairs' documents, so training needs at least 2 pairs (in practice thousands)."
        )
    queries = [q.strip() for q in column(pairs, "query")]
    documents = [d.strip() for d in column(pairs, "document")]
    for key, texts in (("query", queries), ("document", documents)):
        blank = [i for i, t in enumerate(texts) if not t]
        if blank:
            raise DataError(
                f"{where}: {len(blank)} pair(s) have an empty {key} (first: pair {blank[0]}): fill or drop them."
            )
    if len(set(documents)) < 2:
        raise DataError(
            f"{where}: every document is the same text ({documents[0][:60]!r}): there is nothing to tell apart, so "
            "the model learns nothing. Check that the document column holds the pairs' documents."
        )
    if len(set(queries)) < 2:
        raise DataError(
            f"{where}: every query is the same text ({queries[0][:60]!r}): one query cannot be matched with "
            f"{len(set(documents))} different documents, so the model learns nothing. Check the query column."
        )
    same = sum(q == d for q, d in zip(queries, documents))
    if same == n:
        raise DataError(
            f"{where}: every query is identical to its document: the model would only learn to match a text with "
            "itself (the loss reaches 0 without learning retrieval). Check that query and document are not the "
            "same column."
        )
    repeats = n - len(set(zip(queries, documents)))
    if repeats >= 0.5 * n:
        logger.warning(
            "%s: %d of %d pairs repeat another pair: a repeated pair adds no example, and two copies in one batch "
            "are each other's false negatives.",
            where,
            repeats,
            n,
        )
    if same >= 0.1 * n:
        logger.warning(
            "%s: %d of %d pairs have a query identical to its document; they teach only to match a text with itself.",
            where,
            same,
            n,
        )


def load_pairs(cfg: TrainConfig) -> Dataset:
    """All training pairs of ``cfg.train_data`` as one ``Dataset(query, document, domain)`` (sources: see the module
    docstring). ``exclude_domains`` drops rows by domain or by source file name (e.g. ``scifact`` or
    ``scifact_train``); ``max_pairs`` keeps a seeded sample; per-domain prompts are applied to the texts."""
    parts, named = [], []  # each part and the file (or source) it came from
    for source in cfg.train_data:
        if source == "builtin:tiny":
            parts.append(Dataset.from_list(tiny_pairs()))
        elif source.startswith("beir:"):
            folder, _, split = source[len("beir:") :].partition(":")
            parts.append(_load_beir_pairs(folder, split or "train"))
        elif source.startswith("hub:"):
            parts.append(_load_hub_pairs(source[len("hub:") :]))
        else:
            files = jsonl_files(source)
            parts.extend(_load_jsonl_pairs(path) for path in files)
            named.extend(files)
            continue
        named.append(source)
    if not parts:
        raise NoTrainingDataError(f"No training data: set train_data to {TRAIN_DATA_HELP}.")
    if not any(len(p) for p in parts):
        raise DataError(
            f"No training pairs: {', '.join(named)} hold{'s' if len(named) == 1 else ''} no pairs (an empty file, "
            "or no judged query/document pair). Check that train_data names the files you meant, and that they "
            "were written completely."
        )
    parts = [p if "source" in p.column_names else p.add_column("source", column(p, "domain")) for p in parts]
    pairs = concatenate_datasets(parts)
    if cfg.exclude_domains:
        excluded = set(cfg.exclude_domains)
        pairs = pairs.filter(lambda d, s: d not in excluded and s not in excluded, input_columns=["domain", "source"])
    pairs = pairs.remove_columns("source")
    if len(pairs) == 0:
        raise ValueError(f"No training pairs left after excluding domains {cfg.exclude_domains}.")
    if cfg.max_pairs is not None and cfg.max_pairs < len(pairs):
        pairs = pairs.shuffle(seed=cfg.seed).select(range(cfg.max_pairs))
    check_pairs_can_teach(pairs, cfg.train_data)
    if cfg.domain_prompts:

        def prefix(row):
            prompts = cfg.domain_prompts.get(row["domain"], {})
            return {
                "query": prompts.get("query", "") + row["query"],
                "document": prompts.get("document", "") + row["document"],
            }

        pairs = pairs.map(prefix)
    return pairs
