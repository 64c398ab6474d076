"""ContextualTransformer: the two-stage contextual document encoder as one sentence-transformers input module.

Stage 1 (M1, "dataset encoder") embeds J corpus documents into J context vectors:
    tokens -> M1 encoder -> mean pool -> MLP head                      (J, d2)
Stage 2 (M2) embeds a query or document *given* those vectors:
    [c_1 .. c_J ; e(t_1) .. e(t_L)] -> M2 encoder -> mean pool over t   (B, d2)
The context rows enter after the embedding layer, so they have no position: the context is a set. A learned null
vector fills empty slots (fewer than J documents, sequence dropout, or no context at all).

This file is the module itself, top to bottom: construction, prompts, tokenisation, the first stage, the context
lifecycle (and keeping it current), the second stage's forward, and the save/load hooks. It owns four objects and
calls each with what it needs; none calls back: :class:`ActiveContext` (the active context, ``context_state.py``),
:class:`ContextKVCache` (its cached keys/values, ``context_attention.py``), :class:`WeightsCheck` (when to compare
the weights, ``freshness.py``) and :class:`ModelPrompts` (``model_prompts.py``). The steps of the context lifecycle
(activating a context, setting it, re-embedding it, the context one forward reads) are functions of
``context_lifecycle.py`` that take the module, as saving and loading its folder are those of
``persistence.py`` (with the checks of ``integrity.py``); the source encoder and the recipe a new model starts
with: ``source_pipeline.py``; the added parts and pooling: ``heads.py`` (docs/architecture.md has the whole map).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from sentence_transformers.base.modules import InputModule
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from cde_st.context import ContextInfo, check_seed, reads_context_order, sample_prompted_context, validate_texts
from cde_st.modules.backbone import get_adapter
from cde_st.modules.context_attention import ContextKVCache, encode_with_context
from cde_st.modules.context_lifecycle import (
    activate_context,
    context_of_call,
    refresh_module_context,
    set_module_context,
)
from cde_st.modules.context_state import ActiveContext, context_arguments, validate_context_vectors
from cde_st.modules.contextual_config import CONFIG_FILE, ContextualConfig, config_field, field_names
from cde_st.modules.encoders import build_encoder
from cde_st.modules.first_stage_batches import in_input_order, longest_first
from cde_st.modules.freshness import WeightsCheck, embedding_fingerprint
from cde_st.modules.heads import build_added_parameters, instruction_token_id, mean_pool, pool_mask
from cde_st.modules.model_prompts import ModelPrompts, prompt_property
from cde_st.modules.persistence import config_dict, load_module, save_module, warn_if_plain_model
from cde_st.modules.source_pipeline import SourcePipeline, load_source_encoders
from cde_st.text_bounds import bound_texts

__all__ = ["ContextualTransformer"]


class ContextualTransformer(InputModule):
    """Two-stage contextual encoder (CDE, Morris & Rush, ICLR 2025) as a sentence-transformers input module.

    Args:
        first_stage: M1, a HF encoder (or its config dict). Embeds context documents.
        second_stage: M2, a HF encoder (or its config dict). Embeds queries/documents with context prepended.
        tokenizer: tokenizer shared by both stages.
        config: the architecture (:class:`~cde_st.modules.contextual_config.ContextualConfig`, which documents
            every field); None: its defaults.
        query_prompt / document_prompt: prompts for a module outside a model. Inside one, the model's ``prompts``
            are the one stored copy: these seed it where the model has none (context documents always get the
            document prompt).
        **fields: :class:`ContextualConfig` fields, applied over ``config`` (``context_size=64``, ...).

    Every config field reads as an attribute (``module.context_size``); ``max_seq_length``,
    ``context_max_seq_length`` and ``attn_implementation`` can be set (checked again).

    Example:
        >>> from cde_st import ContextualSentenceTransformer
        >>> model = ContextualSentenceTransformer.from_encoder("sentence-transformers/all-MiniLM-L6-v2", context_size=64)
        >>> model.set_context(corpus_texts, seed=0)                       # doctest: +SKIP
        >>> model.encode_query(["what causes rain?"]).shape               # doctest: +SKIP
        (1, 384)
    """

    config_file_name = CONFIG_FILE
    config_keys = list(field_names())
    # The names forward reads (sentence-transformers passes a model's keyword arguments on to the modules that list
    # them): the context of the call, under cde_st's name or the released models' (CONTEXT_ALIAS), and its mask.
    forward_kwargs = {"context_vectors", "context_mask", "dataset_embeddings"}

    def __init__(
        self,
        first_stage: PreTrainedModel | dict,
        second_stage: PreTrainedModel | dict,
        tokenizer,
        config: ContextualConfig | None = None,
        *,
        query_prompt: str | None = None,
        document_prompt: str | None = None,
        **fields,
    ) -> None:
        super().__init__()
        config = ContextualConfig(**fields) if config is None else dataclasses.replace(config, **fields)
        self.tokenizer = tokenizer
        self.first_stage = build_encoder(first_stage, config.attn_implementation)
        self.second_stage = build_encoder(second_stage, config.attn_implementation)
        self.config = config.for_encoders(self.first_stage, self.second_stage)
        self.first_adapter = get_adapter(self.first_stage.config.model_type)
        self.second_adapter = get_adapter(self.second_stage.config.model_type)
        # Explicit prompts, kept only until the module joins a model (then they seed model.prompts: on_model_ready).
        explicit = (("query", query_prompt), ("document", document_prompt))
        self.model_prompts = ModelPrompts({name: value for name, value in explicit if value is not None})
        self._instruction_token_id = instruction_token_id(tokenizer, config.pool_skip_instruction)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        added = build_added_parameters(self.config, self.first_stage, self.second_stage, self.second_adapter, pad_id)
        for name, part in added.items():  # context_head, null_vector, soft_prompt, gates, head, pool
            setattr(self, name, part)
        self.active_context = ActiveContext()  # saved beside the weights (its size varies): context.safetensors
        self.context_cache = ContextKVCache()
        self._register_load_state_dict_pre_hook(self.context_cache.drop)  # new weights: the cache is stale
        self.weights_check = WeightsCheck()  # when a forward compares the weights with the context's
        self.runtime = None  # an OnnxRuntime (backend="onnx"): exported graphs run the two stages instead of torch

    @classmethod
    def from_encoder(cls, name_or_path: str, source: SourcePipeline | None = None, **fields) -> ContextualTransformer:
        """Build M1 and M2 from the same pretrained encoder (a HF model id/folder or a sentence-transformers folder).

        Weights are copied into two independent encoders, as in the paper (:func:`load_source_encoders`; ``source``:
        the folder's :func:`read_source_pipeline`, if read already). Unless ``fields`` names ``context_attention``
        (or a released-compatibility field), the model starts as its source (:data:`STARTS_AS_SOURCE`): untrained, it
        gives the encoder's embeddings whatever the context. ``context_attention="joint"``: the paper's attention
        with :class:`ContextualConfig`'s defaults. Any field given wins over these defaults."""
        first, second, tokenizer, fields = load_source_encoders(name_or_path, fields, source)
        return cls(first, second, tokenizer, **fields)

    def __repr__(self) -> str:
        backbones = f"{self.first_stage.config.model_type}+{self.second_stage.config.model_type}"
        return f"ContextualTransformer(backbones={backbones}, {self.config.to_dict()})"

    # ------------------------------------------------------------------ the config's fields
    context_size, sequence_dropout = config_field("context_size"), config_field("sequence_dropout")
    include_prompt, output_head = config_field("include_prompt"), config_field("output_head")
    first_stage_head, first_stage_norm = config_field("first_stage_head"), config_field("first_stage_norm")
    first_stage_residual = config_field("first_stage_residual")
    context_attention = config_field("context_attention")
    context_gate = config_field("context_gate")
    context_sink, context_centering = config_field("context_sink"), config_field("context_centering")
    pooling = config_field("pooling")
    context_layers = config_field("context_layers")
    soft_prompt_tokens, prefix_positions = config_field("soft_prompt_tokens"), config_field("prefix_positions")
    embed_joint_sequence = config_field("embed_joint_sequence")
    local_attention_scope = config_field("local_attention_scope")
    pool_skip_instruction, context_padding = config_field("pool_skip_instruction"), config_field("context_padding")

    max_seq_length = config_field(
        "max_seq_length",
        "Token limit of second-stage inputs (queries/documents); longer inputs are truncated.",
        "second_stage",
    )
    context_max_seq_length = config_field("context_max_seq_length", "Token limit of context documents.", "first_stage")
    # A record only (a load-time choice, like transformers'): the encoders keep the kernel they were built with.
    attn_implementation = config_field("attn_implementation", "The attention kernel the module was built with.")

    @property
    def device(self) -> torch.device:
        return self.null_vector.device

    @property
    def hidden_size(self) -> int:
        """Width of the context vectors and of the output embedding."""
        return self.second_stage.config.hidden_size

    def get_embedding_dimension(self) -> int:
        return self.hidden_size

    def added_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """The parameters cde_st adds to the two pretrained encoders (context head, output head, null vector,
        context gates, soft prompt): new, so an optimiser may give them their own learning rate."""
        return [(n, p) for n, p in self.named_parameters() if not n.startswith(("first_stage.", "second_stage."))]

    # ------------------------------------------------------------------ prompts (the one copy: the model's)
    query_prompt = prompt_property("query", 'The prompt queries are embedded with (``model.prompts["query"]``).')
    document_prompt = prompt_property(
        "document", 'The prompt documents and context documents are embedded with (``model.prompts["document"]``).'
    )

    # ------------------------------------------------------------------ tokenisation
    def _tokenize(self, texts: list[str], max_length: int) -> dict[str, torch.Tensor]:
        texts = bound_texts(texts, max_length, self.tokenizer)  # a long text is cut first: the same ids, read fast
        return dict(
            self.tokenizer(texts, padding=True, truncation="longest_first", max_length=max_length, return_tensors="pt")
        )

    def preprocess(self, inputs: Sequence[str], prompt: str | None = None, **kwargs) -> dict[str, torch.Tensor | Any]:
        """Tokenise second-stage inputs (with ``prompt`` prepended); records ``prompt_length`` for pooling."""
        texts = validate_texts(inputs, what="input")
        if prompt:
            texts = [prompt + t for t in texts]
        features = self._tokenize(texts, self.max_seq_length)
        if prompt:
            features["prompt_length"] = self.model_prompts.length(prompt, self.tokenizer)
        return features

    def preprocess_context(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """Tokenise first-stage (context) documents. Prompts must already be applied."""
        return self._tokenize(list(texts), self.context_max_seq_length)

    # ------------------------------------------------------------------ first stage
    def embed_context_features(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        """First stage on tokenised documents: (n, L) ids -> (n, d2) context vectors. Differentiable (in torch)."""
        if self.runtime is not None:
            return self.runtime.first_stage(features)
        hidden = self.first_adapter.forward(
            self.first_stage, features["input_ids"], features["attention_mask"], features.get("token_type_ids")
        )
        return self.context_head(mean_pool(hidden, features["attention_mask"]))

    @torch.inference_mode()
    def embed_context_texts(
        self, texts: Sequence[str], batch_size: int = 32, show_progress_bar: bool | None = None
    ) -> torch.Tensor:
        """First stage on raw (already prompted) texts, batched, without grad: -> (n, d2)."""
        texts, was_training = list(texts), self.training
        self.eval()
        batches = self.context_batches(texts, batch_size)
        total = -(-len(texts) // batch_size)
        done = list(tqdm(batches, total=total, desc="Context (first stage)", disable=not show_progress_bar))
        self.train(was_training)
        return in_input_order(done, self.hidden_size, self.device)

    @torch.inference_mode()
    def context_batches(self, texts: Sequence[str], batch_size: int = 32) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
        """:meth:`embed_context_texts` one batch at a time (positions in ``texts``, (n, d2) vectors), the module's
        mode left alone: a caller may run other forwards between two batches (the server does while it creates a
        large context) and still get exactly the vectors :meth:`embed_context_texts` gives."""
        for positions, batch in longest_first(list(texts), batch_size):
            features = {k: v.to(self.device) for k, v in self.preprocess_context(batch).items()}
            yield positions, self.embed_context_features(features).float()

    # ------------------------------------------------------------------ the active context
    @property
    def context_vectors(self) -> torch.Tensor | None:
        """The active context's (J', d2) first-stage vectors (None: no context)."""
        return self.active_context.vectors

    @property
    def context_info(self) -> ContextInfo | None:
        """What the active context is (size, seed, fingerprint, ...; None: no context)."""
        return self.active_context.info

    def embed_context(
        self,
        corpus: Sequence[str],
        seed: int = 0,
        prompt: str | None = None,
        batch_size: int = 32,
        show_progress_bar=None,
    ) -> tuple[torch.Tensor, ContextInfo]:
        """Sample J documents of ``corpus`` (seeded), prefix them, and embed them with the first stage."""
        sampled, info = self.sample_corpus(corpus, seed, prompt)
        return self.embed_context_texts(sampled, batch_size=batch_size, show_progress_bar=show_progress_bar), info

    def sample_corpus(
        self, corpus: Sequence[str], seed: int = 0, prompt: str | None = None, size: int | None = None
    ) -> tuple[list[str], ContextInfo]:
        """The prompted documents :meth:`embed_context` embeds and the :class:`ContextInfo` it returns, without
        embedding them: ``size`` (default J, at most J) documents of the corpus as a set, sampled with ``seed``."""
        size, prompt = self.context_size if size is None else size, self.document_prompt if prompt is None else prompt
        if size > self.context_size:
            raise ValueError(f"A context of {size} documents exceeds the model's {self.context_size} slots (J).")
        # Position-free context rows (ours) read a set; cde-small-v2's rotary context rows read an order.
        return sample_prompted_context(corpus, size, check_seed(seed), prompt, reads_context_order(self))

    def set_context(
        self,
        context: Sequence[str] | torch.Tensor | np.ndarray,
        seed: int = 0,
        prompt: str | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
    ) -> ContextInfo:
        """Make ``context`` the active context: corpus texts (sampled, prefixed, embedded once) or precomputed
        first-stage vectors of shape (n, hidden_size) with n <= context_size. Returns the :class:`ContextInfo`.

        The sample depends only on the corpus as a set of documents, ``context_size`` and ``seed`` (a non-negative
        int), not on the corpus order nor on repeats: a repeated document counts once, blank documents are dropped,
        a mapping (``{id: text}``) gives its texts (see :func:`cde_st.context.context_documents`; an architecture
        whose context rows carry positions, cde-small-v2, gets the chosen documents in corpus order). A numpy array
        of strings counts as texts; vectors that require grad are used detached. The context stays current: if the
        weights it was embedded with change (training, an optimizer step, ``load_state_dict``, ``param.data = ...``),
        the next encode or :meth:`save` re-embeds the same documents."""
        return set_module_context(self, context, seed, prompt, batch_size, show_progress_bar)

    def context_snapshot(self) -> tuple:
        """The active context as an opaque value for :meth:`restore_context` (to set a context temporarily), with the
        first-stage weights it came from: restored after they changed, it is re-embedded at the next use."""
        return self.active_context.snapshot()

    def restore_context(self, snapshot: tuple) -> None:
        """Make a :meth:`context_snapshot` the active context again."""
        vectors, info, texts, weights = snapshot
        activate_context(self, vectors, info, texts, weights=weights)

    def clear_context(self) -> None:
        """Forget the active context: encoding falls back to the null context (with a warning)."""
        activate_context(self, None, None, None)
        self.active_context.warned_null = False

    def validate_context_vectors(self, vectors: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Check precomputed first-stage vectors: 2-D, width hidden_size, at most context_size rows, finite."""
        return validate_context_vectors(vectors, self.hidden_size, self.context_size)

    def warn_null_context(self, stacklevel: int | None = None) -> None:
        """Warn (once until a context is set) that encoding uses the null context."""
        if self.context_size > 0:
            self.active_context.warn_null_once(None if stacklevel is None else stacklevel + 1)

    def context_cache_bytes(self) -> int:
        """Memory held by the cached keys/values of the active context (0 when nothing is cached)."""
        return self.context_cache.nbytes()

    # ------------------------------------------------------------------ keeping the context current
    def refresh_context(self) -> bool:
        """Recompute the active context if the first stage changed since it was set (e.g. by training).

        It compares a fingerprint of the weights' values (:func:`~cde_st.modules.freshness.values_fingerprint`),
        so any change counts (optimizer steps, fused ones too, ``param.data = ...``, ``load_state_dict``). A context
        set from texts is re-embedded from the same documents (its fingerprint stays the same); vectors given
        directly cannot be, and a warning says so once. Called before encoding with the active context (see
        :meth:`one_weights_check`) and by :meth:`save`, so a stale context is never used or written. Returns
        whether the context was recomputed."""
        return refresh_module_context(self)

    @contextmanager
    def one_weights_check(self) -> Iterator[None]:
        """Within the block (one encode call: :meth:`ContextualSentenceTransformer.encode` opens it), the weights are
        compared with those of the active context and its cached keys/values once, at the first forward; the later
        batches only look at the parameters' version counters. Outside such a block every inference forward that
        uses the active context compares the weights' values (:class:`~cde_st.modules.freshness.WeightsCheck`)."""
        with self.weights_check.one_per_call():
            yield

    def embedding_fingerprint(self) -> str:
        """A short hash of everything this module's embeddings depend on besides the input: the active context (its
        vectors, made current first; "none" without one), the values of every weight and the config. Anything that
        caches embeddings of a contextual model keys them by it, so that a cache made with another context (or
        other weights) is never read back (:func:`cde_st.hard_negatives.mine_hard_negatives`)."""
        self.refresh_context()
        runtime = {} if self.runtime is None else {"runtime": self.runtime.identity}  # the graphs compute them
        return embedding_fingerprint(self.context_vectors, list(self.parameters()), self.config.to_dict() | runtime)

    # ------------------------------------------------------------------ second stage
    def forward(
        self,
        features: dict[str, torch.Tensor],
        context_vectors: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        dataset_embeddings: torch.Tensor | None = None,
        **kwargs,
    ) -> dict[str, torch.Tensor]:
        """Second stage: (B, L) ids + (J, d2) context -> ``sentence_embedding`` (B, d2), ``token_embeddings``
        (B, L, d2) of the text positions only.

        ``context_vectors`` (J', d2): the context of this call (None: the active context). ``context_mask`` (B, J')
        bool, with ``context_vectors``: which of them each row may read (training hides a pair's own document from
        it, see ``FilteredInfoNCELoss(leave_one_out=True)``); in cached mode it hides the slot's keys/values, and
        the other slots, which attended to it inside the context, are not recomputed. ``dataset_embeddings``: the
        released models' name for ``context_vectors``. Each may be a ``features`` key instead; both names, or any
        other keyword, is an error (:func:`~cde_st.modules.context_state.context_arguments`)."""
        context_vectors, context_mask = context_arguments(
            features, context_vectors, context_mask, dataset_embeddings, kwargs
        )
        vectors, weights_checked = context_of_call(self, context_vectors)  # (J', d2)
        # Given vectors may reuse the keys/values kept for an equal prefix too (a pool's workers get the context
        # with every chunk, and would otherwise compute its keys/values for every batch, a fifth of the work at
        # J = 512); no once-per-call check covers their forwards (a worker calls them directly), so the weights
        # behind the kept keys/values are compared at each one (a few ms).
        given = context_vectors is not None
        out = encode_with_context(
            features,
            vectors,
            context_mask,
            adapter=self.second_adapter,
            backbone=self.second_stage,
            config=self.config,
            null_vector=self.null_vector,
            soft_prompt=self.soft_prompt,
            gates=self.gates,
            cache=self.context_cache,
            training=self.training,
            reusable=not self.training,
            verify_cache=weights_checked or given,
            runtime=self.runtime,
        )
        features["token_embeddings"] = out
        mask = pool_mask(features, self.include_prompt, self._instruction_token_id)
        features["sentence_embedding"] = self.head(self.pool(out, mask, vectors, context_mask))
        return features

    def train(self, mode: bool = True):
        if mode:
            self.context_cache.drop()  # weights are about to change
        else:
            self.weights_check.mark_due()  # encode() calls eval(): check the weights once per call
        return super().train(mode)

    # ------------------------------------------------------------------ persistence
    def get_config_dict(self) -> dict[str, Any]:
        """``cde_config.json``: the :class:`ContextualConfig`, both encoder configs, the active context's info."""
        return config_dict(self)

    def save_context(self, output_path: str) -> None:
        """Write the active context (refreshed first: never vectors of an older first stage) with the documents it
        was sampled from to ``output_path/context.safetensors``; without a context, remove a stale file."""
        if self.context_vectors is not None:
            self.refresh_context()
        self.active_context.save(output_path)

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        """Write the module to ``output_path`` (:func:`~cde_st.modules.persistence.save_module`)."""
        save_module(self, output_path, safe_serialization=safe_serialization)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", **kwargs: Any) -> ContextualTransformer:
        """Load a saved module (:func:`~cde_st.modules.persistence.load_module`: which of sentence-transformers'
        loading options apply, and the checks that the folder is whole, each failure an error naming the file)."""
        module = load_module(cls, model_name_or_path, subfolder=subfolder, **kwargs)
        module._loaded_from = str(model_name_or_path)  # read once by on_model_ready
        return module

    def on_model_ready(self, model: Any) -> None:
        """sentence-transformers' hook once the model holding this module is built: join its prompts; a folder loaded
        into a plain SentenceTransformer is told how to load it as a contextual model."""
        super().on_model_ready(model)
        self.model_prompts.join(model)
        loaded_from, self._loaded_from = getattr(self, "_loaded_from", None), None
        warn_if_plain_model(loaded_from, model)


# A stable class reference in modules.json, independent of the file layout.
ContextualTransformer.__module__ = "cde_st"
