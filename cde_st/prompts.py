"""The prompts (task prefixes) of contextual models: the one place their text is written.

CDE models are trained with Nomic-style task prefixes: a query is embedded as ``"search_query: " + text`` and a
document (and every context document) as ``"search_document: " + text``. MTEB's other task types use their own
prefixes, as in Nomic's MTEB evaluation. A model stores the prompts it uses once, in ``model.prompts``
(sentence-transformers' own place, saved in ``config_sentence_transformers.json``); everything else reads them there.

Example:
    >>> from cde_st.prompts import DEFAULT_PROMPTS
    >>> DEFAULT_PROMPTS["query"] + "what causes rain?"
    'search_query: what causes rain?'
"""

from __future__ import annotations

QUERY_PROMPT = "search_query: "
DOCUMENT_PROMPT = "search_document: "
CLASSIFICATION_PROMPT = "classification: "
CLUSTERING_PROMPT = "clustering: "

# The prompt names a contextual model stores in ``model.prompts`` (``encode_query`` / ``encode_document`` use them).
DEFAULT_PROMPTS: dict[str, str] = {"query": QUERY_PROMPT, "document": DOCUMENT_PROMPT}
