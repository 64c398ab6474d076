"""The rule for query ids that are also corpus ids in retrieval scoring: ignore them (BEIR's rule) or keep them.

BEIR's "ignore identical ids" rule exists for datasets whose queries *are* corpus documents (ArguAna, Quora): there
a query would retrieve itself. Classic collections (MED, CACM, LISA) number queries and documents 1..N
independently, so ids coincide by accident and the rule would remove relevant documents. ``identical_ids`` chooses:
``"auto"`` (an mteb task's own setting; for a local folder that is no mteb task, decided from the texts by
:func:`queries_are_documents`), ``"ignore"`` or ``"keep"``. The rule used and why end up in
``task.identical_ids_rule`` (logged, and reported with the scores).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from cde_st.data import column
from cde_st.evaluation.pools import corpus_texts

logger = logging.getLogger(__name__)

#: ``identical_ids`` choices: ``auto`` (an mteb twin's own setting; else decided from the texts, see
#: :func:`queries_are_documents`), ``ignore``, ``keep``.
IDENTICAL_IDS_RULES = ("auto", "ignore", "keep")

#: ``identical_ids="auto"`` ignores a query's own id when more than this share of the shared ids are queries that
#: are the document itself (the query text equals or is contained in the document's text).
SAME_TEXT_SHARE = 0.5

#: A query shorter than this (in words) counts as its document only when the two texts are equal: one word, or
#: none, is contained in almost any document, which says nothing about whether the query *is* that document.
MIN_CONTAINED_WORDS = 3


def _normal_text(text: str) -> str:
    return " ".join(text.lower().split())


def _is_the_document(query: str, document: str) -> bool:
    query, document = _normal_text(query), _normal_text(document)
    if not query:
        return False
    return query == document or (len(query.split()) >= MIN_CONTAINED_WORDS and query in document)


def queries_are_documents(
    queries: Mapping[str, str],
    documents: Mapping[str, str],
    qrels: Mapping[str, Mapping[str, float]] | None = None,
) -> tuple[bool, str]:
    """Whether a query's own id should be left out of its results, decided from the texts: ``(ignore, why)``.

    BEIR's "ignore identical ids" rule exists for datasets whose queries *are* corpus documents (ArguAna, Quora):
    there a query would retrieve itself. Classic test collections (MED, CACM, LISA) number queries and documents
    1..N independently, so ids coincide by accident and query 7 may well be judged relevant to document 7: the rule
    would remove a relevant document. So: never when ``qrels`` judge a query's own id relevant to it (ignoring would
    remove that relevant document); otherwise ignore only when, for more than :data:`SAME_TEXT_SHARE` of the ids
    that are both a query and a document, the query's text (case and spacing aside) equals the document's text
    (``title text``) or, for a query of at least :data:`MIN_CONTAINED_WORDS` words, is contained in it. An empty
    query is never its document.

    Example:
        >>> queries_are_documents({"1": "a cat"}, {"1": "Title a cat sat", "2": "x"})[0]
        True
    """
    shared = [q for q in queries if q in documents]
    if not shared:
        return False, "auto: no query id is also a corpus id"
    same = sum(1 for q in shared if _is_the_document(queries[q], documents[q]))
    detail = f"auto, from the texts: {same} of {len(shared)} query ids that are also corpus ids have the query text in"
    if same <= SAME_TEXT_SHARE * len(shared):
        return False, f"{detail} that document: the ids coincide, the texts differ"
    judged = [q for q in shared if qrels is not None and (qrels.get(q) or {}).get(q, 0) > 0]
    if judged:
        return False, (
            f"auto: {len(judged)} of {len(shared)} query ids that are also corpus ids have that document judged "
            f"relevant (e.g. query {judged[0]!r}): ignoring identical ids would remove relevant documents"
        )
    return True, f"{detail} that document: the queries are corpus documents"


def apply_identical_ids(task: Any, identical_ids: str) -> Any:
    """Set (``ignore`` / ``keep``) or describe (``auto``) a retrieval task's rule for identical query/document ids."""
    if identical_ids not in IDENTICAL_IDS_RULES:
        raise ValueError(f"identical_ids must be one of {IDENTICAL_IDS_RULES}, got {identical_ids!r}.")
    if not hasattr(task, "ignore_identical_ids") or getattr(task, "local_source", None) is not None:
        return task  # not retrieval, or a local folder (load_local_task set its rule)
    if identical_ids == "auto":
        why = f"the setting of mteb task {task.metadata.name}"
    else:
        task.ignore_identical_ids = identical_ids == "ignore"
        why = f"identical_ids={identical_ids!r} was asked for"
    verb = "ignore" if task.ignore_identical_ids else "keep"
    task.identical_ids_rule = f"{verb} identical query/document ids ({why})"
    return task


def set_local_rule(task: Any, identical_ids: str, twin_name: str) -> None:
    """The rule of a local retrieval task as :func:`~cde_st.evaluation.local_tasks.load_local_task` builds it:
    forced by ``identical_ids``, else its mteb twin's own setting, else decided from the texts when the data is
    loaded (:func:`describe_identical_ids`)."""
    if identical_ids != "auto":
        task.ignore_identical_ids = identical_ids == "ignore"
        task.identical_ids_why = f"identical_ids={identical_ids!r} was asked for"
    elif twin_name:
        task.identical_ids_why = f"the setting of mteb task {twin_name}"
    else:  # decided from the texts when the data is read (describe_identical_ids)
        task.ignore_identical_ids = False
        task.identical_ids_from_texts = True
        task.identical_ids_why = "decided from the texts when the data is loaded"
    verb = "ignore" if task.ignore_identical_ids else "keep"
    task.identical_ids_rule = f"{verb} identical query/document ids ({task.identical_ids_why})"


def describe_identical_ids(task: Any) -> None:
    """For a local retrieval task whose data was just loaded: count the query ids that are also corpus ids and say
    which rule scores them (log + ``task.identical_ids_rule``); with ``identical_ids="auto"`` on a folder that is no
    mteb task, decide the rule from the texts first (:func:`queries_are_documents`)."""
    shared = total = 0
    queries: dict[str, str] = {}
    documents: dict[str, str] = {}
    qrels: dict[str, dict[str, float]] = {}
    for splits in task.dataset.values():
        for data in splits.values():
            query_ids = set(column(data["queries"], "id"))
            shared += len(query_ids & set(column(data["corpus"], "id")))
            total += len(query_ids)
            if getattr(task, "identical_ids_from_texts", False):
                queries.update(zip(column(data["queries"], "id"), column(data["queries"], "text")))
                documents.update(zip(column(data["corpus"], "id"), corpus_texts(data["corpus"])))
                for query, judged in (data.get("relevant_docs") or {}).items():
                    qrels.setdefault(query, {}).update(judged)
    if getattr(task, "identical_ids_from_texts", False):
        task.ignore_identical_ids, task.identical_ids_why = queries_are_documents(queries, documents, qrels)
    verb = "ignore" if task.ignore_identical_ids else "keep"
    why = task.identical_ids_why
    overlap = f"{shared} of {total} query ids are also corpus ids"
    task.identical_ids_rule = f"{verb} identical query/document ids ({why}; {overlap})"
    if shared:
        effect = (
            "a query's own document is left out of its results"
            if task.ignore_identical_ids
            else "a query may retrieve its own document"
        )
        logger.warning("%s: %s: %s.", task.metadata.name, task.identical_ids_rule, effect)
    else:
        logger.info("%s: %s.", task.metadata.name, task.identical_ids_rule)
