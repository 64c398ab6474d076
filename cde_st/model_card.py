"""The model card (README.md) a :class:`~cde_st.ContextualSentenceTransformer` writes on ``save()``.

sentence-transformers renders its usual template; :class:`ContextualModelCardData` replaces the template's usage
snippet (which would load the folder with ``SentenceTransformer`` and no context) with a section that says what the
saved context is, how to load the model and why that way, and a snippet that runs as written. The section sits
between two HTML comments, so a card reused from a loaded folder gets it refreshed on the next ``save()``
(:func:`refresh_contextual_section`): the card always describes the context saved beside it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from sentence_transformers.sentence_transformer.model_card import SentenceTransformerModelCardData

from cde_st.cache_key_warning import warn_if_read_as_cache_key

if TYPE_CHECKING:
    from cde_st.context import ContextInfo

logger = logging.getLogger(__name__)

SECTION_BEGIN = "<!-- cde_st:usage begin (regenerated on every save) -->"
SECTION_END = "<!-- cde_st:usage end -->"

_EXAMPLES = [
    "Which planet is known as the Red Planet?",
    "Venus is often called Earth's twin because of its similar size and proximity.",
    "Mars, known for its reddish appearance, is often referred to as the Red Planet.",
    "Saturn, famous for its rings, is sometimes mistaken for the Red Planet.",
]


def describe_context(info: ContextInfo | None, context_size: int) -> str:
    """Markdown: what the active context is and how it was set (or that none is set)."""
    if info is None:
        return (
            f"No corpus context is saved with this model ({context_size} context slots). Give it the corpus you "
            "will search before encoding: `model.set_context(corpus_texts, seed=0)` samples "
            f"{context_size} documents (seeded, without replacement), embeds them once with the first stage and "
            "keeps the vectors. Without a context the model falls back to its learned null context (a plain "
            "bi-encoder) and warns."
        )
    if info.source == "vectors":
        origin = f"{info.size} precomputed first-stage vectors (no corpus recorded)"
    else:
        corpus = f"a corpus of {info.corpus_size:,} texts" if info.corpus_size is not None else "a corpus"
        seed = f"seed {info.seed}" if info.seed is not None else "no seed recorded"
        prompt = f"prefixed with `{info.prompt!r}`" if info.prompt else "with no prefix"
        origin = f"{info.size} documents sampled ({seed}) from {corpus}, {prompt}"
    return (
        f"The corpus context saved with this model (`context.safetensors`, active as soon as the model is loaded): "
        f"{origin}; fingerprint `{info.fingerprint}`, {context_size} context slots. Queries and documents are "
        "embedded given this context, so the embeddings fit that corpus. To search another corpus, give the model "
        "its context first: `model.set_context(corpus_texts, seed=0)`; `model.context_info` shows the active one."
    )


_LOADING = (
    "Load it with `ContextualSentenceTransformer(path_or_id)` from the `cde_st` package: the installed package "
    "supplies the model's module classes, so no `trust_remote_code` is needed and no code is imported from the "
    "model folder. Plain `SentenceTransformer(path_or_id)` refuses the folder and suggests "
    "`trust_remote_code=True`; do not follow that advice: the flag runs code from the folder (sentence-transformers "
    "then imports a `cde_st.py` found in the folder or hub repository in place of the installed package), and "
    "gives a plain `SentenceTransformer` without `set_context`."
)

ABOUT_BEGIN = "<!-- cde_st:about begin -->"
ABOUT_END = "<!-- cde_st:about end -->"
# sentence-transformers' template opens with this sentence; for a model it did not see trained it reads
# "This is a sentence-transformers model trained.", which says nothing about a contextual model.
_TEMPLATE_INTRO = re.compile(r"^This is a \[sentence-transformers\]\(https://www\.SBERT\.net\) model.*$", re.MULTILINE)


def _how_made(card_data: SentenceTransformerModelCardData) -> str:
    """One sentence: trained here (with what), converted from a released checkpoint, or not trained."""
    if "generated_from_trainer" in (card_data.tags or []):
        losses = [tag.removeprefix("loss:") for tag in card_data.tags if tag.startswith("loss:")]
        pairs = sum(int(d.get("size") or 0) for d in card_data.train_datasets or [])
        steps = card_data.training_logs[-1].get("Step") if card_data.training_logs else None
        what = " and ".join(f"`{loss}`" for loss in losses) or "its loss"
        on = f" on {pairs:,} training pairs" if pairs else ""
        for_steps = f" for {steps:,} steps" if steps else ""
        return (
            f"It was trained with sentence-transformers' trainer and {what}{on}{for_steps}; the Training Details "
            "below list the data, the hyperparameters and the losses logged."
        )
    if card_data.base_model:
        return (
            f"It is the released [{card_data.base_model}](https://huggingface.co/{card_data.base_model}), converted "
            "to cde_st's native modules (same weights and outputs, no remote code)."
        )
    config = card_data.model[0].config
    if config.context_gate and config.output_head == "none" and not config.soft_prompt_tokens:
        return (
            "It has not been trained: built from a pretrained encoder (`ContextualSentenceTransformer.from_encoder`), "
            "it reads the context through zero-initialised gates and so gives that encoder's own embeddings "
            "until training opens them."
        )
    return (
        "It has not been trained: built from a pretrained encoder (`ContextualSentenceTransformer.from_encoder`), "
        "what it adds to that encoder (context attention, heads) starts at random, so train it before use."
    )


def describe_model(card_data: SentenceTransformerModelCardData) -> str:
    """The card's opening paragraph (between :data:`ABOUT_BEGIN` and :data:`ABOUT_END`): what the model is, how it
    was made, how to load it."""
    model = card_data.model
    module = model[0]
    dim = model.get_sentence_embedding_dimension()
    return "\n".join(
        [
            ABOUT_BEGIN,
            f"This is a **contextual document embedding** model (CDE; Morris & Rush, ICLR 2025) made with "
            f"the `cde_st` package for sentence-transformers: a first stage embeds {module.context_size} "
            f"documents sampled from the corpus you search (the *context*, set once per corpus), and a second stage "
            f"embeds every query and document given those vectors, into {dim} dimensions, for "
            f"{card_data.task_name}. {_how_made(card_data)}",
            "",
            "Load it with `ContextualSentenceTransformer(path_or_id)` from the `cde_st` package, then give it its "
            "corpus with `model.set_context(corpus_texts)` (see Usage). Plain `SentenceTransformer(path_or_id)` "
            "refuses it and suggests `trust_remote_code=True`; that is not the way (see Loading below).",
            ABOUT_END,
        ]
    )


def with_model_description(card: str, card_data: SentenceTransformerModelCardData) -> str:
    """``card`` with sentence-transformers' opening sentence replaced by :func:`describe_model` (a card without
    that sentence, e.g. one already described, is returned unchanged)."""
    if not isinstance(card_data, ContextualModelCardData) or card_data.model is None:
        return card
    if not _TEMPLATE_INTRO.search(card):
        return card
    try:
        about = describe_model(card_data)
    except Exception as exc:  # as sentence-transformers does: a card problem never fails save()
        logger.warning(f"Could not describe the model in its model card: {exc}")
        return card
    return _TEMPLATE_INTRO.sub(lambda _: about, card, count=1)


@dataclass
class ContextualModelCardData(SentenceTransformerModelCardData):
    """Model card data of a contextual model: the usage section describes the context and the loading route.

    Used automatically by :class:`~cde_st.ContextualSentenceTransformer` (``model_card_data_class``); pass one as
    ``model_card_data=`` to set ``model_id``, ``license``, ``language`` and so on as with any sentence-transformers
    model.
    """

    tags: list[str] = field(
        default_factory=lambda: [
            "sentence-transformers",
            "sentence-similarity",
            "feature-extraction",
            "dense",
            "cde_st",
            "contextual-document-embeddings",
        ]
    )

    def __getattribute__(self, name: str):
        if name == "base_model":
            # sentence-transformers' mine_hard_negatives keys its embedding cache by this name alone.
            warn_if_read_as_cache_key()
        return super().__getattribute__(name)

    def _model_reference(self) -> str:
        # The hub id when pushing, else the folder as given to save(): the snippet then runs as written.
        return self.model_id or self.save_dir or "path/to/this/model"

    def run_usage_snippet(self) -> None:
        """Encode the snippet's examples as the snippet will: with the saved context, or with the documents as
        context when none is saved (never with the null context)."""
        if self.usage_examples is None:
            self.usage_examples = list(_EXAMPLES)
        if not self.generate_widget_examples:
            return
        model = self.model
        query, documents = self.usage_examples[0], self.usage_examples[1:]
        kwargs = {"convert_to_tensor": True, "show_progress_bar": False}
        if model.context_info is None:
            kwargs["context_vectors"] = model.embed_context(documents, seed=0)
        q = model.encode_query([query], **kwargs)
        d = model.encode_document(documents, **kwargs)
        similarity = model.similarity(q, d)
        with torch._tensor_str.printoptions(precision=4, sci_mode=False):
            self.similarities = "\n".join(f"# {line}" for line in str(similarity.cpu()).splitlines())

    def generate_usage_snippet(self) -> str:
        model = self.model
        info = model.context_info
        examples = self.usage_examples or list(_EXAMPLES)
        dim = self._get_snippet_output_dimensionality()
        lines = [
            "from cde_st import ContextualSentenceTransformer",
            "",
            f"model = ContextualSentenceTransformer({self._model_reference()!r})  # no trust_remote_code needed",
            "queries = [",
            f"    {examples[0]!r},",
            "]",
            "documents = [",
            *(f"    {doc!r}," for doc in examples[1:]),
            "]",
        ]
        if info is None:
            lines += [
                "# No context is saved with this model: the corpus you search is the context (set it once).",
                "model.set_context(documents, seed=0)",
            ]
        else:
            lines += [
                "# The saved corpus context is active:",
                "print(model.context_info.size, model.context_info.fingerprint)",
                f"# {info.size} {info.fingerprint}",
            ]
        lines += [
            "query_embeddings = model.encode_query(queries)  # query prompt + context",
            "document_embeddings = model.encode_document(documents)  # document prompt + context",
            "print(query_embeddings.shape, document_embeddings.shape)",
            f"# (1, {dim}) ({len(examples) - 1}, {dim})",
            "similarities = model.similarity(query_embeddings, document_embeddings)",
            "print(similarities)",
        ]
        lines += self.similarities.splitlines() if self.similarities else [f"# shape (1, {len(examples) - 1})"]
        if info is not None:
            lines += [
                "",
                "# Another corpus: its documents become the context (sampled, seeded; the first stage runs once).",
                "# model.set_context(corpus_texts, seed=0)",
            ]
        prompts = model.prompts or {}
        prompt_lines = ", ".join(f"{name}: `{prompt!r}`" for name, prompt in sorted(prompts.items()) if prompt)
        parts = [
            SECTION_BEGIN,
            "This is a **contextual document embedding** model (CDE; Morris & Rush, ICLR 2025): it embeds text "
            "given a sample of the corpus it is used on, the *context*. Install the `cde_st` package, which "
            "plugs into sentence-transformers.",
            "",
            "#### Context",
            "",
            describe_context(info, model.context_size),
            "",
            "#### Loading",
            "",
            _LOADING,
            "",
            f"Prompts ({prompt_lines or 'none'}) are applied by `encode_query` / `encode_document`; other "
            "libraries must be given them (see the cde_st docs, docs/integrations.md).",
            "",
            "```python",
            *lines,
            "```",
            SECTION_END,
        ]
        return "\n".join(parts)


def refresh_contextual_section(card: str, card_data: SentenceTransformerModelCardData) -> str:
    """``card`` with its cde_st usage section regenerated (a card without one is returned unchanged)."""
    if not isinstance(card_data, ContextualModelCardData) or SECTION_BEGIN not in card or card_data.model is None:
        return card
    try:
        card_data.run_usage_snippet()
        section = card_data.generate_usage_snippet()
    except Exception as exc:  # as sentence-transformers does: a card problem never fails save()
        logger.warning(f"Could not refresh the cde_st section of the model card: {exc}")
        return card
    pattern = re.compile(re.escape(SECTION_BEGIN) + r".*?" + re.escape(SECTION_END), flags=re.DOTALL)
    return pattern.sub(lambda _: section, card, count=1)
