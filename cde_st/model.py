"""ContextualSentenceTransformer: a SentenceTransformer whose first module is a ContextualTransformer.

It loads from a folder without ``trust_remote_code`` (its module classes are registered), and adds the context hook
(:meth:`set_context`, :meth:`clear_context`, :attr:`context_info`). The same hook is available for any
``SentenceTransformer`` that holds a :class:`ContextualTransformer` (e.g. one loaded with
``SentenceTransformer(path, trust_remote_code=True)``) through the module-level :func:`set_context`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Normalize

from cde_st.context import ContextInfo
from cde_st.model_card import ContextualModelCardData, refresh_contextual_section, with_model_description
from cde_st.modules.contextual_transformer import ContextualTransformer
from cde_st.modules.loading_options import check_backend
from cde_st.modules.source_pipeline import read_source_pipeline
from cde_st.released import ALIASES as RELEASED_ALIASES
from cde_st.released import PROMPTS as RELEASED_PROMPTS
from cde_st.released import is_released_checkpoint, load_released, offline_hub_problem, resolve_name

_MODULE_CLASSES = {
    "cde_st.ContextualTransformer": ContextualTransformer,
    "cde_st.modules.ContextualTransformer": ContextualTransformer,
    "cde_st.modules.contextual_transformer.ContextualTransformer": ContextualTransformer,
}


class _DocumentPromptNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Default prompt name is set to 'document'.")


@contextlib.contextmanager
def _without_document_prompt_notice():
    """Load without sentence-transformers' "Default prompt name is set to 'document'" warning: a contextual model
    saves ``default_prompt_name="document"`` on purpose (``encode`` embeds like ``encode_document``, matching the
    context; see the class docstring), so the warning would greet every load and evaluation with nothing to do."""
    st_logger = logging.getLogger("sentence_transformers.base.model")
    notice = _DocumentPromptNotice()
    st_logger.addFilter(notice)
    try:
        yield
    finally:
        st_logger.removeFilter(notice)


def contextual_module(model: torch.nn.Module) -> ContextualTransformer:
    """The :class:`ContextualTransformer` of ``model`` (a SentenceTransformer or the module itself)."""
    if isinstance(model, ContextualTransformer):
        return model
    if isinstance(model, SentenceTransformer) and len(model) and isinstance(model[0], ContextualTransformer):
        return model[0]
    raise TypeError(
        f"{type(model).__name__} is not a contextual model: its first module is not a ContextualTransformer."
    )


def is_contextual(model: torch.nn.Module) -> bool:
    """Whether ``model`` is (or starts with) a :class:`ContextualTransformer`."""
    try:
        contextual_module(model)
    except TypeError:
        return False
    return True


def set_context(
    model: torch.nn.Module,
    context: Sequence[str] | torch.Tensor | np.ndarray,
    seed: int = 0,
    prompt: str | None = None,
    batch_size: int = 32,
    show_progress_bar: bool | None = None,
) -> ContextInfo:
    """Set the active context of any contextual model (see :meth:`ContextualTransformer.set_context`).

    Example:
        >>> model = SentenceTransformer("path/to/cde_model", trust_remote_code=True)  # doctest: +SKIP
        >>> cde_st.set_context(model, corpus_texts, seed=0)                           # doctest: +SKIP
    """
    return contextual_module(model).set_context(
        context, seed=seed, prompt=prompt, batch_size=batch_size, show_progress_bar=show_progress_bar
    )


def context_prompt(model: torch.nn.Module) -> str:
    """The prompt context documents get: the one the model encodes documents with, ``model.prompts["document"]``
    ("" if it has none; the module's own prompt for a module outside a model). Every route
    (``ContextualSentenceTransformer.set_context``, :func:`set_context`, ``model[0].set_context``) reads it from the
    module, which reads its model's prompts (:mod:`cde_st.modules.model_prompts`)."""
    return contextual_module(model).document_prompt


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _check_model_location(name_or_path: str) -> None:
    """A name that is neither an existing path nor a hub id ("owner/name") or released alias is a missing folder:
    say so, instead of the hub error (or offline-mode error) a lookup would give."""
    name = resolve_name(name_or_path)
    path = os.path.expanduser(name)
    if os.path.exists(path) or _HUB_ID.fullmatch(name):
        return
    raise FileNotFoundError(
        f"Model folder {name_or_path!r} does not exist (looked for {os.path.abspath(path)}), and it is not a hub id "
        f"('owner/name') either. Give the folder model.save() wrote, a hub id, or a released model "
        f"({', '.join(RELEASED_ALIASES)})."
    )


class ContextualSentenceTransformer(SentenceTransformer):
    """A contextual document embedding model (CDE, Morris & Rush, ICLR 2025) as a ``SentenceTransformer``.

    Build one from a pretrained encoder with :meth:`from_encoder`, load a saved one with
    ``ContextualSentenceTransformer(path)``. Set the corpus context once, then encode as usual::

        model = ContextualSentenceTransformer.from_encoder("sentence-transformers/all-MiniLM-L6-v2", context_size=64)
        model.set_context(corpus_texts, seed=0)          # samples 64 documents, runs the first stage once
        q = model.encode_query(["what causes rain?"])      # "search_query: " prefix + corpus context
        d = model.encode_document(corpus_texts)            # "search_document: " prefix + corpus context
        model.save("my-cde")                               # the context is saved with the model

    ``encode(..., context_vectors=vectors)`` overrides the context for one call (``dataset_embeddings=``, the
    released models' name for it, is accepted too). With no context the model
    uses the null context (a plain bi-encoder) and warns once.

    Prompts: ``encode_query`` applies ``prompts["query"]``, ``encode_document`` and the context documents
    ``prompts["document"]``, and plain ``encode(texts)`` embeds like ``encode_document``: a model with a document
    prompt has ``default_prompt_name="document"`` (sentence-transformers' default prompt, saved with the model, so
    ``SentenceTransformer(path, trust_remote_code=True)`` does the same). ``encode(texts, prompt="")`` embeds with
    no prompt; ``model.default_prompt_name = None`` turns the default off for this model object.

    The released models load natively, without remote code (see :mod:`cde_st.released`)::

        model = ContextualSentenceTransformer("jxm/cde-small-v2")   # or "cde-small", "cde-small-v1", a local copy
        model.set_context(corpus_texts)                             # 512 documents, a small corpus tiled evenly

    ``backbone_config=`` and ``tokenizer=`` override where a released model's backbone config and tokenizer come
    from (default: files beside the released ones, else the ``embedder`` repo named in its config).
    """

    _module_classes = _MODULE_CLASSES
    # The card says what the context is and how to load the model (see cde_st/model_card.py).
    model_card_data_class = ContextualModelCardData

    def __init__(
        self,
        model_name_or_path: str | None = None,
        *,
        backbone_config: str | dict | None = None,
        tokenizer: Any = None,
        **kwargs,
    ) -> None:
        check_backend(kwargs.get("backend", "torch"))  # before any loading: the released path builds modules itself
        if model_name_or_path is not None and not kwargs.get("modules"):
            _check_model_location(str(model_name_or_path))
        hub = {k: kwargs.get(k) for k in ("revision", "cache_folder", "token")}
        hub["local_files_only"] = bool(kwargs.get("local_files_only", False))
        if (
            model_name_or_path is not None
            and not kwargs.get("modules")
            and is_released_checkpoint(str(model_name_or_path), **hub)
        ):
            check_backend(kwargs.pop("backend", "torch"), released=True)
            module = load_released(
                str(model_name_or_path),
                backbone_config=backbone_config,
                tokenizer=tokenizer,
                model_kwargs=kwargs.pop("model_kwargs", None),
                **hub,
            )
            for key in ("revision", "cache_folder", "token", "local_files_only", "trust_remote_code"):
                kwargs.pop(key, None)
            kwargs.setdefault("prompts", dict(RELEASED_PROMPTS))
            kwargs.setdefault("similarity_fn_name", "cosine")
            # The released cards L2-normalise the second-stage output.
            super().__init__(modules=[module, Normalize()], **kwargs)
            name = resolve_name(str(model_name_or_path))
            if not os.path.isdir(os.path.expanduser(name)):
                self.model_card_data.base_model = name  # a hub id (set directly: set_base_model queries the hub)
        else:
            if backbone_config is not None or tokenizer is not None:
                raise ValueError(
                    "backbone_config= and tokenizer= only apply to released CDE checkpoints (config.json with "
                    f"transductive_corpus_size); {model_name_or_path!r} is not one."
                )
            try:
                with _without_document_prompt_notice():
                    super().__init__(model_name_or_path, **kwargs)
            except OSError as err:  # transformers' offline error names no model
                unreachable = offline_hub_problem(str(model_name_or_path), hub["cache_folder"], hub["local_files_only"])
                if model_name_or_path is None or unreachable is None:
                    raise
                raise OSError(unreachable) from err
        if not is_contextual(self):
            first = type(self[0]).__name__ if len(self) else "nothing"
            raise ValueError(
                f"ContextualSentenceTransformer needs a ContextualTransformer as first module, got {first}. "
                "To build a contextual model from a pretrained encoder use "
                "ContextualSentenceTransformer.from_encoder(name_or_path, context_size=J)."
            )
        if self.default_prompt_name is None and self.prompts.get("document"):
            # encode() embeds like encode_document (sentence-transformers' default prompt), matching the context.
            self.default_prompt_name = "document"

    @classmethod
    def from_encoder(
        cls,
        name_or_path: str,
        context_size: int = 512,
        prompts: dict[str, str] | None = None,
        device: str | None = None,
        normalize: bool | None = None,
        **config,
    ) -> ContextualSentenceTransformer:
        """Build M1 and M2 from the same pretrained encoder (HF id/folder or sentence-transformers folder).

        The new model starts as its source: untrained, it gives the encoder's embeddings whatever the context
        (the ``mini`` preset's recipe: cached context read by the top three layers through a zero-initialised
        gate, no added heads; see :meth:`ContextualTransformer.from_encoder`). Training then adds what the
        context contributes. ``context_attention="joint"`` gives the paper's joint attention instead (untrained,
        it is not its source: the context changes every embedding).

        ``normalize``: end with a Normalize module (unit-length embeddings). None (default): exactly when the
        source sentence-transformers model does (all-MiniLM-L6-v2 does; a plain HF encoder does not), so the new
        model's embeddings have the norms of its source's, which k-means clustering and logistic-regression
        classification (MTEB) see.

        ``config`` holds any :class:`ContextualTransformer` field (``sequence_dropout``, ``output_head``,
        ``include_prompt``, ``max_seq_length``, ...; see :class:`~cde_st.modules.ContextualConfig`), and
        ``query_prompt`` / ``document_prompt`` (used when ``prompts`` is None).
        """
        source = read_source_pipeline(name_or_path)
        module = ContextualTransformer.from_encoder(name_or_path, source=source, context_size=context_size, **config)
        if prompts is None:
            prompts = {"query": module.query_prompt, "document": module.document_prompt}
        modules = [module, Normalize()] if (source.normalize if normalize is None else normalize) else [module]
        return cls(modules=modules, prompts=prompts, device=device)

    def _update_default_model_id(self, model_card: str) -> str:
        # save() reuses the card read from a loaded folder: refresh its cde_st section, which must describe the
        # context saved now and the folder it is saved to.
        return refresh_contextual_section(super()._update_default_model_id(model_card), self.model_card_data)

    def _create_model_card(self, path: str, *args, **kwargs) -> None:
        super()._create_model_card(path, *args, **kwargs)
        # The template's opening sentence knows nothing of the context nor of how to load the folder.
        readme = os.path.join(path, "README.md")
        if os.path.exists(readme):
            with open(readme, encoding="utf8") as f:
                card = f.read()
            described = with_model_description(card, self.model_card_data)
            if described != card:
                with open(readme, "w", encoding="utf8") as f:
                    f.write(described)

    def encode(self, *args, **kwargs):
        """sentence-transformers' ``encode``, with the context of this call as ``context_vectors=`` (first-stage
        vectors, (n <= J, hidden_size)) or under the released models' name for it, ``dataset_embeddings=``."""
        if "dataset_embeddings" in kwargs:
            if "context_vectors" in kwargs:
                raise TypeError("encode() got both context_vectors= and dataset_embeddings= (its alias); pass one.")
            kwargs["context_vectors"] = kwargs.pop("dataset_embeddings")
        if (
            self._distributed_inference is not None
            and kwargs.get("pool") is None
            and kwargs.get("device") is None
            and "context_vectors" not in kwargs
        ):
            # sentence-transformers' distributed evaluation (the trainer's evaluator with several ranks) sends this
            # call's inputs and keywords to every rank, and each rank encodes with its own model copy, whose active
            # context is not this one (the evaluator sets it on rank 0 only): send the context along.
            kwargs["context_vectors"] = self._context_for_other_processes()
        # The weights are checked against the active context once per call, not once per batch.
        with self.contextual_module.one_weights_check():
            return super().encode(*args, **kwargs)

    def forward(self, input: dict[str, torch.Tensor], **kwargs) -> dict[str, torch.Tensor]:
        """sentence-transformers' forward, refusing a keyword no module reads: it hands each module only the names
        that module lists, so a misspelt ``context_vectors`` would otherwise reach nothing and the call would use
        the active context without a word."""
        unknown = set(kwargs) - set(self.get_model_kwargs()) - {"task"}
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.forward() got keyword argument(s) {sorted(unknown)} that no module reads; "
                f"the model reads {sorted(self.get_model_kwargs())}."
            )
        return super().forward(input, **kwargs)

    def _multi_process(self, inputs, *args, **kwargs):
        # Worker processes hold a copy of the model made when the pool started: hand them the *current* context
        # explicitly (an empty one for none), so a context set or cleared later never goes stale in the pool.
        if "context_vectors" not in kwargs:
            kwargs["context_vectors"] = self._context_for_other_processes()
        return super()._multi_process(inputs, *args, **kwargs)

    def _context_for_other_processes(self) -> torch.Tensor:
        """The active context as vectors another process's copy of the model can be given (an empty one for none:
        the null context, warned about here)."""
        module = self.contextual_module
        module.refresh_context()  # the other processes get the vectors of the current first stage
        if module.context_vectors is None:
            module.warn_null_context()
            return torch.zeros(0, module.hidden_size)
        return module.context_vectors.detach().cpu()

    @property
    def contextual_module(self) -> ContextualTransformer:
        return contextual_module(self)

    def get_sentence_embedding_dimension(self) -> int | None:
        """The old name of :meth:`get_embedding_dimension`, without sentence-transformers' FutureWarning: mteb 2.x
        calls it whenever it describes a SentenceTransformer (``ModelMeta``), so every direct mteb evaluation of a
        CDE model printed a deprecation warning that users read as an error."""
        return self.get_embedding_dimension()

    @property
    def context_size(self) -> int:
        """J, the number of context slots."""
        return self.contextual_module.context_size

    @property
    def context_info(self) -> ContextInfo | None:
        """The active context (size, seed, fingerprint, ...) or None."""
        return self.contextual_module.context_info

    def set_context(
        self,
        context: Sequence[str] | torch.Tensor | np.ndarray,
        seed: int = 0,
        prompt: str | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
    ) -> ContextInfo:
        """Sample J documents of ``context`` (seeded, without replacement; tiled only if fewer than J), prefix them
        with the document prompt (or ``prompt``), embed them with the first stage once and cache the vectors.
        ``context`` may instead be precomputed first-stage vectors of shape (n <= J, hidden_size)."""
        return set_context(
            self, context, seed=seed, prompt=prompt, batch_size=batch_size, show_progress_bar=show_progress_bar
        )

    def embed_context(
        self, corpus: Sequence[str], seed: int = 0, prompt: str | None = None, batch_size: int = 32
    ) -> torch.Tensor:
        """First-stage vectors (J, hidden_size) of a corpus sample, without making them active; pass them as
        ``context_vectors=`` to ``encode`` or to :meth:`set_context`."""
        return self.contextual_module.embed_context(corpus, seed=seed, prompt=prompt, batch_size=batch_size)[0]

    def clear_context(self) -> None:
        """Drop the active context."""
        self.contextual_module.clear_context()
