"""ContextualTransformer: the two-stage contextual document encoder as one sentence-transformers input module.

Stage 1 (M1, "dataset encoder") embeds J corpus documents into J context vectors:
    tokens -> M1 encoder -> mean pool -> MLP head                      (J, d2)
Stage 2 (M2) embeds a query or document *given* those vectors:
    [c_1 .. c_J ; e(t_1) .. e(t_L)] -> M2 encoder -> mean pool over t   (B, d2)
The context rows enter after the embedding layer, so they have no position: the context is a set. A learned null
vector fills empty slots (fewer than J documents, sequence dropout, or no context at all).

This file is the module itself, top to bottom: construction from a :class:`ContextualConfig`, prompts,
tokenisation, the first stage, the context lifecycle, the second stage's forward, save/load. It owns three
objects and calls each with what it needs; none of them calls back: the active context (``context_state.py``,
:class:`ActiveContext`), the cached context keys/values (``context_attention.py``, :class:`ContextKVCache`, beside
the text's attention over the context) and the prompts read through the model that holds the module
(``model_prompts.py``, :class:`ModelPrompts`). Its other collaborators: the settings and their rules
(``contextual_config.py``), the backbone families (``backbone.py``), the folder integrity checks
(``integrity.py``) and what a source encoder's folder does (``source_pipeline.py``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_model
from sentence_transformers.base.modules import InputModule
from sentence_transformers.util import load_file_path
from torch import nn
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from cde_st.context import (
    ContextInfo,
    check_seed,
    context_documents,
    fingerprint_array,
    fingerprint_texts,
    sample_context,
    validate_texts,
)
from cde_st.modules.backbone import get_adapter
from cde_st.modules.context_attention import ContextKVCache, encode_with_context
from cde_st.modules.context_state import (
    CONTEXT_FILE,
    ActiveContext,
    first_stage_fingerprint,
    read_context_file,
    validate_context_vectors,
    values_fingerprint,
)
from cde_st.modules.contextual_config import (
    CONFIG_FILE,
    ContextualConfig,
    check_seq_length,
    field_names,
    legacy_prompts,
    position_limit,
    read_config_file,
)
from cde_st.modules.encoders import build_encoder, load_pretrained_pair
from cde_st.modules.heads import Head, SoftPrompt, mean_pool
from cde_st.modules.integrity import (
    STAGES,
    WEIGHTS_NAMES,
    check_manifest,
    load_checked_weights,
    save_metadata,
    tokenizer_source,
    write_manifest,
)
from cde_st.modules.loading_options import check_backend, resolve_dtype, split_model_kwargs
from cde_st.modules.model_prompts import ModelPrompts
from cde_st.modules.source_pipeline import SourcePipeline, read_source_pipeline
from cde_st.modules.warning_location import caller_stacklevel
from cde_st.text_bounds import bound_texts

logger = logging.getLogger(__name__)

#: The recipe a model built by :meth:`ContextualTransformer.from_encoder` starts with unless told otherwise: an
#: untrained model that is exactly its source encoder whatever the context (cached context read through a
#: zero-initialised gate, no added heads). This is the one home of the recipe; the ``mini`` training preset
#: (``cde_st/training/presets/mini.yaml``) writes the same fields out so that a run's config records them, and
#: ``tests/training/test_config.py`` checks that the two agree. ContextualConfig's own defaults (joint attention,
#: heads) stay those of the paper, so folders saved without these fields load unchanged.
STARTS_AS_SOURCE: dict[str, Any] = {
    "context_attention": "cached",
    "context_gate": True,
    "output_head": "none",
    "first_stage_head": "none",
}
#: With :data:`STARTS_AS_SOURCE`, this many top second-stage layers read the context (MiniLM's 6: [3, 4, 5]).
STARTS_AS_SOURCE_READING_LAYERS = 3


def starts_as_source_layers(num_layers: int) -> list[int]:
    """The ``context_layers`` of :data:`STARTS_AS_SOURCE` for a second stage of ``num_layers`` layers."""
    return list(range(max(0, num_layers - STARTS_AS_SOURCE_READING_LAYERS), num_layers))


def _config_field(name: str) -> property:
    return property(lambda self: getattr(self.config, name), doc=f"``config.{name}`` (see ContextualConfig).")


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
        self.first_stage = (
            first_stage
            if isinstance(first_stage, PreTrainedModel)
            else build_encoder(first_stage, config.attn_implementation)
        )
        self.second_stage = (
            second_stage
            if isinstance(second_stage, PreTrainedModel)
            else build_encoder(second_stage, config.attn_implementation)
        )
        self.config = config.for_encoders(self.first_stage, self.second_stage)
        self.first_adapter = get_adapter(self.first_stage.config.model_type)
        self.second_adapter = get_adapter(self.second_stage.config.model_type)
        # Explicit prompts, kept only until the module joins a model (then they seed model.prompts: on_model_ready).
        explicit = (("query", query_prompt), ("document", document_prompt))
        self._model_prompts = ModelPrompts({name: value for name, value in explicit if value is not None})
        self._instruction_token_id = None
        if config.pool_skip_instruction is not None:
            ids = tokenizer.encode(config.pool_skip_instruction, add_special_tokens=False)
            if not ids:
                raise ValueError(f"pool_skip_instruction={config.pool_skip_instruction!r} tokenises to nothing.")
            self._instruction_token_id = ids[0]
        self._build_added_parameters()
        # The active context: (J', d2) first-stage vectors, J' <= context_size, and what they came from. Not in the
        # weights file (its size varies); saved beside it as context.safetensors.
        self.active_context = ActiveContext()
        self.context_cache = ContextKVCache()
        self._register_load_state_dict_pre_hook(self.context_cache.drop)  # new weights: the cache is stale
        self._warned_null_context = False
        self._weights_check_due = True  # set by eval() (once per encode call): compare fingerprints before use
        self._weights_key: tuple | None = None  # (parameters, their (storage, version)) at the last check
        # Depth of one_weights_check() scopes (an encode call): inside one, the batches after the first trust the
        # parameters' version counters; outside, every forward compares the weights' values.
        self._one_check_depth = 0
        self._prompt_length_cache: dict[str, int] = {}

    def _build_added_parameters(self) -> None:
        """The parameters cde_st adds to the two encoders: context head, null vector, soft prompt, gates, output head
        (in this order, which fixes how a seeded construction draws their initial values)."""
        config, config2 = self.config, self.second_stage.config
        d1, d2 = self.first_stage.config.hidden_size, config2.hidden_size
        if config.first_stage_head == "mlp":
            head = Head(d1, d2, "gelu", residual=config.first_stage_residual and d1 == d2)
        else:
            head = nn.Identity()
        if config.first_stage_norm:
            # Context rows replace token embeddings at M2's input: normalise them like M2's embedding layer does
            # (initialised from it), so a model built from a pretrained encoder starts close to in-distribution.
            source = self.second_adapter.input_norm(self.second_stage)
            if source is not None:
                norm = nn.LayerNorm(d2, eps=source.eps, bias=source.bias is not None)
                norm.load_state_dict(source.state_dict())
            else:
                norm = nn.LayerNorm(d2, eps=getattr(config2, "layer_norm_eps", 1e-12))
            head = nn.Sequential(head, norm)
        self.context_head = head
        # The null slot starts as M2's own [PAD] embedding, which pretrained encoders learn to attend past.
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        with torch.no_grad():
            pad = self.second_adapter.embed_tokens(self.second_stage, torch.tensor([[pad_id]]), None)[0, 0]
        self.null_vector = nn.Parameter(pad.detach().clone())
        self.soft_prompt = SoftPrompt(d2, config.soft_prompt_tokens) if config.soft_prompt_tokens else None
        self.gates = (
            nn.Parameter(torch.zeros(config2.num_hidden_layers, config2.num_attention_heads))
            if config.context_gate
            else None
        )
        self.head = (
            nn.Identity()
            if config.output_head == "none"
            else Head(d2, d2, "relu", residual=config.output_head == "residual_mlp")
        )

    @classmethod
    def from_encoder(cls, name_or_path: str, source: SourcePipeline | None = None, **fields) -> ContextualTransformer:
        """Build M1 and M2 from the same pretrained encoder (a HF model id/folder or a sentence-transformers folder).

        Weights are copied into two independent encoders (not shared), as in the paper. For a
        sentence-transformers folder the Transformer module's subfolder and ``max_seq_length`` are used.
        ``source``: the :func:`read_source_pipeline` of ``name_or_path`` when the caller has already read it.

        Unless ``fields`` names ``context_attention`` (or a released-compatibility field), the model starts as its
        source (:data:`STARTS_AS_SOURCE`: cached context read through a zero-initialised gate by the top three
        second-stage layers, no added heads), so untrained it gives the encoder's embeddings whatever the context.
        ``context_attention="joint"`` gives the paper's joint attention with :class:`ContextualConfig`'s defaults
        (an untrained model then mixes the context into every text). Any field given wins over these defaults.
        """
        source = read_source_pipeline(name_or_path) if source is None else source
        start_as_source = "context_attention" not in fields and not (
            fields.get("embed_joint_sequence") or fields.get("prefix_positions", "none") != "none"
        )
        if start_as_source:
            fields = {**STARTS_AS_SOURCE, **fields}
        if source.pooling_mode != "mean":
            warnings.warn(
                f"{name_or_path!r} pools with {source.pooling_mode!r}; the contextual model mean-pools its second "
                "stage, so it does not start with that encoder's embeddings.",
                UserWarning,
                stacklevel=caller_stacklevel(),
            )
        first, second, tokenizer = load_pretrained_pair(source.model_dir, fields.get("attn_implementation", "auto"))
        if start_as_source and "context_layers" not in fields:
            fields["context_layers"] = starts_as_source_layers(second.config.num_hidden_layers)
        if "max_seq_length" not in fields:
            model_max = getattr(tokenizer, "model_max_length", 512) or 512
            limit = position_limit(second) or 512
            fields["max_seq_length"] = int(min(source.max_seq_length or model_max, model_max, 512, limit))
        return cls(first, second, tokenizer, **fields)

    def __repr__(self) -> str:
        backbones = f"{self.first_stage.config.model_type}+{self.second_stage.config.model_type}"
        return f"ContextualTransformer(backbones={backbones}, {self.config.to_dict()})"

    # ------------------------------------------------------------------ the config's fields
    context_size = _config_field("context_size")
    sequence_dropout = _config_field("sequence_dropout")
    include_prompt = _config_field("include_prompt")
    first_stage_head = _config_field("first_stage_head")
    first_stage_residual = _config_field("first_stage_residual")
    first_stage_norm = _config_field("first_stage_norm")
    output_head = _config_field("output_head")
    context_attention = _config_field("context_attention")
    context_gate = _config_field("context_gate")
    context_layers = _config_field("context_layers")
    soft_prompt_tokens = _config_field("soft_prompt_tokens")
    prefix_positions = _config_field("prefix_positions")
    embed_joint_sequence = _config_field("embed_joint_sequence")
    local_attention_scope = _config_field("local_attention_scope")
    pool_skip_instruction = _config_field("pool_skip_instruction")
    context_padding = _config_field("context_padding")

    @property
    def max_seq_length(self) -> int:
        """Token limit of second-stage inputs (queries/documents); longer inputs are truncated."""
        return self.config.max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        value = check_seq_length("max_seq_length", value, self.second_stage)
        self.config = dataclasses.replace(self.config, max_seq_length=value)

    @property
    def context_max_seq_length(self) -> int:
        """Token limit of first-stage (context) documents."""
        return self.config.context_max_seq_length

    @context_max_seq_length.setter
    def context_max_seq_length(self, value: int) -> None:
        value = check_seq_length("context_max_seq_length", value, self.first_stage)
        self.config = dataclasses.replace(self.config, context_max_seq_length=value)

    @property
    def attn_implementation(self) -> str | None:
        """The attention kernel setting the module was built with (and saves)."""
        return self.config.attn_implementation

    @attn_implementation.setter
    def attn_implementation(self, value: str | None) -> None:
        # A record only (a load-time choice, like transformers'): the encoders keep the kernel they were built with.
        self.config = dataclasses.replace(self.config, attn_implementation=value)

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

    # ------------------------------------------------------------------ prompts
    @property
    def query_prompt(self) -> str:
        """The prompt queries are embedded with (``model.prompts["query"]`` inside a model)."""
        return self._model_prompts.get("query", self)

    @query_prompt.setter
    def query_prompt(self, value: str) -> None:
        self._model_prompts.set("query", value, self)

    @property
    def document_prompt(self) -> str:
        """The prompt documents and the context documents are embedded with (``model.prompts["document"]``)."""
        return self._model_prompts.get("document", self)

    @document_prompt.setter
    def document_prompt(self, value: str) -> None:
        self._model_prompts.set("document", value, self)

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
            features["prompt_length"] = self._prompt_length(prompt)
        return features

    def preprocess_context(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """Tokenise first-stage (context) documents. Prompts must already be applied."""
        return self._tokenize(list(texts), self.context_max_seq_length)

    def _prompt_length(self, prompt: str) -> int:
        if prompt not in self._prompt_length_cache:
            ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
            # [CLS] prompt [SEP]: the trailing special token is not part of the prompt.
            n = len(ids) - (1 if ids and ids[-1] in self.tokenizer.all_special_ids else 0)
            self._prompt_length_cache[prompt] = n
        return self._prompt_length_cache[prompt]

    # ------------------------------------------------------------------ first stage
    def embed_context_features(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        """First stage on tokenised documents: (n, L) ids -> (n, d2) context vectors. Differentiable."""
        hidden = self.first_adapter.forward(
            self.first_stage, features["input_ids"], features["attention_mask"], features.get("token_type_ids")
        )
        return self.context_head(mean_pool(hidden, features["attention_mask"]))

    @torch.inference_mode()
    def embed_context_texts(
        self, texts: Sequence[str], batch_size: int = 32, show_progress_bar: bool | None = None
    ) -> torch.Tensor:
        """First stage on raw (already prompted) texts, batched, without grad: -> (n, d2)."""
        texts = list(texts)
        was_training = self.training
        self.eval()
        batches = self.context_batches(texts, batch_size)
        total = -(-len(texts) // batch_size)
        done = list(tqdm(batches, total=total, desc="Context (first stage)", disable=not show_progress_bar))
        self.train(was_training)
        if not done:
            return torch.zeros(0, self.hidden_size, device=self.device)
        vectors = torch.cat([chunk for _, chunk in done])
        order = np.concatenate([positions for positions, _ in done])
        return vectors[torch.as_tensor(np.argsort(order), device=vectors.device)]

    @torch.inference_mode()
    def context_batches(self, texts: Sequence[str], batch_size: int = 32) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
        """The first stage of :meth:`embed_context_texts` one batch at a time, longest texts first: yields (the
        batch's positions in ``texts``, its (n, d2) float vectors). It leaves the module's mode alone (call it in
        eval mode), so a caller may run other forwards between two batches (the server interleaves embeddings with
        a large context's creation) and still get exactly the vectors :meth:`embed_context_texts` gives."""
        texts = list(texts)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        for start in range(0, len(texts), batch_size):
            positions = order[start : start + batch_size]
            features = self.preprocess_context([texts[i] for i in positions])
            features = {k: v.to(self.device) for k, v in features.items()}
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
        show_progress_bar: bool | None = None,
    ) -> tuple[torch.Tensor, ContextInfo]:
        """Sample J documents of ``corpus`` (seeded), prefix them, and embed them with the first stage."""
        vectors, info, _ = self._embed_corpus(corpus, seed, prompt, batch_size, show_progress_bar)
        return vectors, info

    def _embed_corpus(self, corpus, seed, prompt, batch_size, show_progress_bar):
        """:meth:`embed_context`, plus the sampled (prompted) documents, which set_context keeps."""
        sampled, info = self.sample_corpus(corpus, seed, prompt)
        vectors = self.embed_context_texts(sampled, batch_size=batch_size, show_progress_bar=show_progress_bar)
        return vectors, info, sampled

    def sample_corpus(
        self, corpus: Sequence[str], seed: int = 0, prompt: str | None = None, size: int | None = None
    ) -> tuple[list[str], ContextInfo]:
        """The prompted documents :meth:`embed_context` embeds and the :class:`ContextInfo` it returns, without
        embedding them: ``size`` (default J, at most J) documents of the corpus as a set, sampled with ``seed``."""
        size = self.context_size if size is None else size
        if size > self.context_size:
            raise ValueError(f"A context of {size} documents exceeds the model's {self.context_size} slots (J).")
        corpus = context_documents(corpus)  # the corpus as a set of documents, the rule of every route
        prompt = self.document_prompt if prompt is None else prompt
        # Position-free context rows (ours) read a set; cde-small-v2's rotary context rows read an order.
        keep_order = self.prefix_positions == "sequence"
        sampled = [prompt + t for t in sample_context(corpus, size, check_seed(seed), keep_order=keep_order)]
        info = ContextInfo(
            size=len(sampled),
            seed=seed,
            fingerprint=fingerprint_texts(sampled),
            source="texts",
            prompt=prompt,
            corpus_size=len(corpus),
        )
        return sampled, info

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
        if context is None:
            raise TypeError(
                "set_context: context is None. Give corpus texts (a list of strings) or first-stage vectors of "
                f"shape (n, {self.hidden_size}); to remove the active context, call clear_context()."
            )
        if isinstance(context, np.ndarray) and context.dtype.kind in "USO":
            context = context.tolist()  # strings (or objects, checked as texts)
        if isinstance(context, (torch.Tensor, np.ndarray)):
            vectors = self.validate_context_vectors(context).detach()
            info = ContextInfo(
                size=len(vectors), seed=None, fingerprint=fingerprint_array(vectors.cpu().numpy()), source="vectors"
            )
            texts = None
        else:
            vectors, info, texts = self._embed_corpus(context, check_seed(seed), prompt, batch_size, show_progress_bar)
        self._activate_context(vectors, info, texts)
        return info

    def _activate_context(
        self,
        vectors: torch.Tensor | None,
        info: ContextInfo | None,
        texts: list[str] | None,
        weights: torch.Tensor | None = None,
    ) -> None:
        """The one place the active context changes (None: no context). ``texts``: the prompted documents the
        vectors were embedded from, kept to re-embed them if the first stage changes. ``weights``: the first-stage
        fingerprint the vectors belong to (None: the current weights, i.e. the vectors were just computed)."""
        token_ids = torch.unique(self.preprocess_context(texts)["input_ids"]).to(self.device) if texts else None
        if vectors is not None and weights is None:
            weights = first_stage_fingerprint(self.first_stage, self.context_head, token_ids)
        self.active_context.replace(vectors, info, texts, token_ids, weights, self.device)
        self.context_cache.drop()  # the keys/values of the previous context

    def context_snapshot(self) -> tuple:
        """The active context as an opaque value for :meth:`restore_context` (to set a context temporarily). It
        remembers which first-stage weights the vectors came from, so restoring it after the weights changed
        re-embeds them at the next use instead of passing them off as current."""
        return self.active_context.snapshot()

    def restore_context(self, snapshot: tuple) -> None:
        """Make a :meth:`context_snapshot` the active context again."""
        vectors, info, texts, weights = snapshot
        self._activate_context(vectors, info, texts, weights=weights)

    def clear_context(self) -> None:
        """Forget the active context: encoding falls back to the null context (with a warning)."""
        self._activate_context(None, None, None)
        self._warned_null_context = False

    def validate_context_vectors(self, vectors: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Check precomputed first-stage vectors: 2-D, width hidden_size, at most context_size rows, finite
        (:func:`~cde_st.modules.context_state.validate_context_vectors`)."""
        return validate_context_vectors(vectors, self.hidden_size, self.context_size)

    def warn_null_context(self, stacklevel: int | None = None) -> None:
        """Warn (once until a context is set) that encoding uses the null context."""
        if self.context_size > 0 and not self._warned_null_context:
            warnings.warn(
                "No context is set: encoding with the null context (the model then acts as a plain bi-encoder). "
                "Call model.set_context(corpus_texts) first, or pass context_vectors=.",
                UserWarning,
                stacklevel=caller_stacklevel() if stacklevel is None else stacklevel,
            )
            self._warned_null_context = True

    def context_cache_bytes(self) -> int:
        """Memory held by the cached keys/values of the active context (0 when nothing is cached)."""
        return self.context_cache.nbytes()

    # ------------------------------------------------------------------ keeping the context current
    def _first_stage_fingerprint(self, token_ids: torch.Tensor | None) -> torch.Tensor:
        return first_stage_fingerprint(self.first_stage, self.context_head, token_ids)

    def refresh_context(self) -> bool:
        """Recompute the active context if the first stage changed since it was set (e.g. by training).

        The check compares a fingerprint of the weights' values
        (:func:`~cde_st.modules.context_state.values_fingerprint`), so any way of changing them counts: optimizer
        steps (fused ones too), ``param.data = ...``, in-place edits, ``load_state_dict``. A context set from texts
        is re-embedded from the same sampled documents (its fingerprint stays the same); vectors given directly
        cannot be recomputed, and a warning says so once. Called before the first batch of every encode that uses
        the active context and by :meth:`save`, so a stale context is never used or written. Returns whether the
        context was recomputed."""
        context = self.active_context
        if not context.is_stale(self._first_stage_fingerprint):
            return False
        if context.texts is None:
            context.warn_stale_once()
            return False
        logger.info(
            "The first stage changed since set_context: re-embedding the %d context documents.", len(context.texts)
        )
        self._activate_context(self.embed_context_texts(context.texts), context.info, context.texts)
        return True

    @contextmanager
    def one_weights_check(self) -> Iterator[None]:
        """Within the block (one encode call: :meth:`ContextualSentenceTransformer.encode` opens it), the weights are
        compared with those of the active context and its cached keys/values once, at the first forward; the later
        batches only look at the parameters' version counters (nothing can change the weights between the batches
        of one call). Outside such a block every inference forward that uses the active context compares the
        weights' values (a few ms for MiniLM), because a change no version counter records (a fused optimizer step,
        an edit through ``param.data``) may have happened between two direct forward calls."""
        self._one_check_depth += 1
        self._weights_check_due = True
        try:
            yield
        finally:
            self._one_check_depth -= 1

    def _check_weights(self) -> bool:
        """Before an inference forward uses the active context: compare the fingerprint of the first-stage weights
        it came from with the current one (re-embed it where they differ). Inside :meth:`one_weights_check` (an
        encode call) only the first forward does, and later ones again if a parameter's storage or version counter
        moved; every other forward does. Returns whether it compared: then the forward compares the cached
        keys/values' second stage too (:meth:`ContextKVCache.drop_if_stale`)."""
        if self._one_check_depth > 0 and not self._weights_check_due and self._weights_key is not None:
            params, key = self._weights_key
            if key == tuple((p.data_ptr(), p._version) for p in params):
                return False
        self.refresh_context()
        params = list(self.parameters())  # listed once per check: walking the module tree per batch costs ~1 ms
        self._weights_key = (params, tuple((p.data_ptr(), p._version) for p in params))
        self._weights_check_due = False
        return True

    def embedding_fingerprint(self) -> str:
        """A short hash of everything this module's embeddings depend on besides the input: the active context (its
        vectors, made current first; "none" without one), the values of every weight and the config. Anything that
        caches embeddings of a contextual model keys them by it, so that a cache made with another context (or
        other weights) is never read back (:func:`cde_st.hard_negatives.mine_hard_negatives`)."""
        self.refresh_context()
        digest = hashlib.sha256()
        if self.context_vectors is None:
            digest.update(b"no context")
        else:
            vectors = self.context_vectors.detach().float().cpu().contiguous()
            digest.update(str(tuple(vectors.shape)).encode() + vectors.numpy().tobytes())
        digest.update(values_fingerprint(list(self.parameters())).numpy().tobytes())
        digest.update(json.dumps(self.config.to_dict(), sort_keys=True, default=str).encode())
        return digest.hexdigest()[:16]

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

        ``context_vectors`` (J', d2), as a keyword or a ``features`` key: the context of this call (None: the
        active context). ``context_mask`` (B, J') bool, with ``context_vectors``: which of them each row may read
        (training hides a pair's own document from it, see ``FilteredInfoNCELoss(leave_one_out=True)``). In cached
        mode it hides the slot's keys/values; the other slots, which attended to it inside the context, are not
        recomputed. ``dataset_embeddings`` (keyword or ``features`` key): the released models' name for
        ``context_vectors``; giving both is an error, and so is any other keyword (a misspelt name would otherwise
        leave the call on the active context without a word)."""
        if kwargs:
            raise TypeError(
                f"ContextualTransformer.forward() got unexpected keyword argument(s) {sorted(kwargs)}; it accepts "
                f"{sorted(self.forward_kwargs)}."
            )
        context_vectors = self._call_context(context_vectors, dataset_embeddings, features)
        if context_mask is None:
            context_mask = features.get("context_mask")
        if context_mask is not None and context_vectors is None:
            raise ValueError("context_mask needs the context it masks: pass context_vectors as well.")
        vectors, weights_checked = self._context_of_call(context_vectors)  # (J', d2)
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
            reusable=context_vectors is None and not self.training,
            verify_cache=weights_checked,
        )
        features["token_embeddings"] = out
        features["sentence_embedding"] = self.head(mean_pool(out, self._pool_mask(features)))
        return features

    @staticmethod
    def _call_context(context_vectors, dataset_embeddings, features: dict) -> torch.Tensor | None:
        """The context of one forward, given under either name, as a keyword or a ``features`` key (None: the
        active context)."""
        given = {
            name: value
            for name, value in (
                (
                    "context_vectors",
                    context_vectors if context_vectors is not None else features.get("context_vectors"),
                ),
                (
                    "dataset_embeddings",
                    dataset_embeddings if dataset_embeddings is not None else features.get("dataset_embeddings"),
                ),
            )
            if value is not None
        }
        if len(given) > 1:
            raise TypeError(
                "forward() got both context_vectors= and dataset_embeddings= (its alias, the released models' name); "
                "pass one."
            )
        return next(iter(given.values()), None)

    def _context_of_call(self, given: torch.Tensor | np.ndarray | None) -> tuple[torch.Tensor, bool]:
        """The (J', d2) context vectors one forward reads: ``given`` (checked), else the active context (made
        current first at inference), else none (J' = 0; at inference with a warning); and whether the weights were
        compared just now (:meth:`_check_weights`)."""
        if given is not None:
            # Checked whether or not they require grad: NaN or too many rows must fail in training as well.
            return self.validate_context_vectors(given).to(device=self.device), False
        self.active_context.check_pool_copy()
        checked = not self.training and self._check_weights()
        vectors = self.context_vectors
        if vectors is not None:
            if vectors.is_inference() and not torch.is_inference_mode_enabled():
                vectors = vectors.clone()  # embedded under inference mode; autograd may need to save them
            return vectors, checked
        if not self.training:
            self.warn_null_context()
        return self.null_vector.new_zeros(0, self.hidden_size), checked

    def _pool_mask(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        """The text positions mean pooling reads: not padding, not the prompt (``include_prompt=False``), not the
        task instruction (``pool_skip_instruction``)."""
        input_ids, pool_mask = features["input_ids"], features["attention_mask"]
        prompt_length = features.get("prompt_length")
        if not self.include_prompt and prompt_length is not None:
            pl = int(prompt_length[0]) if isinstance(prompt_length, torch.Tensor) else int(prompt_length)
            pool_mask = pool_mask.clone()
            pool_mask[:, :pl] = 0
        if self._instruction_token_id is None:
            return pool_mask
        # Drop positions 0..p, p the first position > 0 holding the instruction delimiter (if any).
        hits = (input_ids == self._instruction_token_id) & pool_mask.bool()
        hits[:, 0] = False
        found = hits.any(dim=1, keepdim=True)
        end = hits.int().argmax(dim=1, keepdim=True)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        return pool_mask * ~(found & (positions <= end))

    def train(self, mode: bool = True):
        if mode:
            self.context_cache.drop()  # weights are about to change
        else:
            self._weights_check_due = True  # encode() calls eval(): check the weights once per call
        return super().train(mode)

    # ------------------------------------------------------------------ persistence
    def get_config_dict(self) -> dict[str, Any]:
        """``cde_config.json``: the :class:`ContextualConfig`, both encoder configs, the active context's info."""
        config = self.config.to_dict()
        for stage in STAGES:
            encoder_config = getattr(self, stage).config
            config[f"{stage}_config"] = encoder_config.to_diff_dict() | {"model_type": encoder_config.model_type}
        config["context_info"] = self.context_info.to_dict() if self.context_info is not None else None
        return config

    def save_context(self, output_path: str) -> None:
        """Write the active context (refreshed first: never vectors of an older first stage) with the documents it
        was sampled from to ``output_path/context.safetensors``; without a context, remove a stale file."""
        if self.context_vectors is not None:
            self.refresh_context()
        self.active_context.save(output_path)

    def load_context(self, context_path: str, exists: bool, context_info: dict | None, config_path: str) -> None:
        """Restore the saved context: ``context.safetensors`` must agree with the ``context_info`` that
        ``cde_config.json`` records, and passes the checks of :meth:`validate_context_vectors`."""
        saved = read_context_file(context_path, exists, context_info, config_path, self.validate_context_vectors)
        if saved is not None:
            self._activate_context(*saved)

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        os.makedirs(output_path, exist_ok=True)
        self.save_config(output_path)
        if safe_serialization:
            # The metadata records what the weights go with (encoder configs, tokenizer size), checked on load.
            stages = {stage: getattr(self, stage).config for stage in STAGES}
            metadata = save_metadata(stages, self.tokenizer)
            save_model(self, os.path.join(output_path, WEIGHTS_NAMES[0]), metadata=metadata)
            written = [WEIGHTS_NAMES[0]]
        else:
            self.save_torch_weights(output_path, safe_serialization=False)
            written = [WEIGHTS_NAMES[1]]
        written += self._save_tokenizer_files(output_path)
        self.save_context(output_path)
        if self.context_vectors is not None:
            written.append(CONTEXT_FILE)
        # Last: the record of what this save wrote, which load checks so that files of two saves are never mixed.
        write_manifest(output_path, written)

    def _save_tokenizer_files(self, output_path: str) -> list[str]:
        """Save the tokenizer; the names of the files it wrote in ``output_path``."""
        if not isinstance(self.tokenizer, PreTrainedTokenizerBase):
            self.save_tokenizer(output_path)
            return []
        paths = self.tokenizer.save_pretrained(output_path)
        folder = os.path.abspath(output_path)
        return [
            os.path.basename(path)
            for path in paths
            if os.path.isfile(path) and os.path.dirname(os.path.abspath(path)) == folder
        ]

    @classmethod
    def load(
        cls,
        model_name_or_path: str,
        subfolder: str = "",
        token: bool | str | None = None,
        cache_folder: str | None = None,
        revision: str | None = None,
        local_files_only: bool = False,
        backend: str = "torch",
        model_kwargs: dict[str, Any] | None = None,
        **kwargs,
    ) -> ContextualTransformer:
        """Load a saved module. Of sentence-transformers' loading options, ``model_kwargs`` ``dtype`` (or
        ``torch_dtype``; "auto": the saved dtype) and ``attn_implementation`` apply to both encoders; other
        ``model_kwargs``, ``config_kwargs`` and ``processor_kwargs`` are ignored with a warning; a ``backend``
        other than "torch" is an error.

        The folder must be whole (:mod:`cde_st.modules.integrity`): a tokenizer that fits the embedding tables,
        weights named and shaped as ``cde_config.json`` says and saved with the same encoder configs, no NaN/inf.
        Anything else is a ValueError naming the folder, the file and the field."""
        check_backend(backend)
        dtype, attn_implementation = split_model_kwargs(model_kwargs, "ContextualTransformer.load", **kwargs)
        hub = dict(
            subfolder=subfolder,
            token=token,
            cache_folder=cache_folder,
            revision=revision,
            local_files_only=local_files_only,
        )
        config_path = load_file_path(model_name_or_path, CONFIG_FILE, **hub)
        if config_path is None:
            raise FileNotFoundError(f"No {CONFIG_FILE} in {model_name_or_path!r}: not a cde_st model.")
        saved = read_config_file(config_path)
        dtype = resolve_dtype(dtype, saved["second_stage_config"])
        tokenizer_dir = cls.load_dir_path(model_name_or_path, **hub)
        try:
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        except (OSError, ValueError, TypeError) as exc:
            raise ValueError(
                f"The tokenizer of {tokenizer_source(tokenizer_dir)} cannot be loaded ({type(exc).__name__}: {exc}). "
                "Put the tokenizer files the model was saved with (tokenizer.json, tokenizer_config.json) back "
                "beside the weights, or save the model again."
            ) from None
        try:
            config = ContextualConfig.from_dict(saved)
            # A load-time choice (like transformers' attn_implementation): a later save keeps the saved value.
            built_with = config.attn_implementation if attn_implementation is None else attn_implementation
            first, second = saved["first_stage_config"], saved["second_stage_config"]
            module = cls(first, second, tokenizer, config, attn_implementation=built_with, **legacy_prompts(saved))
        except (ValueError, TypeError) as exc:  # a field of the wrong type or value
            raise ValueError(f"{config_path}: {exc}") from None
        module.attn_implementation = config.attn_implementation
        weights = load_file_path(model_name_or_path, "model.safetensors", **hub) or load_file_path(
            model_name_or_path, "pytorch_model.bin", **hub
        )
        load_checked_weights(module, weights, config_path, tokenizer_dir)
        if dtype is not None:
            module.to(dtype)  # before the context is restored: the saved context vectors stay float32
        context_path = load_file_path(model_name_or_path, CONTEXT_FILE, **hub)
        expected_path = os.path.join(model_name_or_path, subfolder, CONTEXT_FILE)
        module.load_context(
            context_path or expected_path, context_path is not None, saved.get("context_info"), config_path
        )
        # Last, once each file has passed its own checks: the files were written together by one save.
        used = [os.path.basename(weights)]
        if context_path is not None and saved.get("context_info") is not None:
            used.append(CONTEXT_FILE)
        check_manifest(lambda name: load_file_path(model_name_or_path, name, **hub), used)
        module._loaded_from = str(model_name_or_path)  # read once by on_model_ready
        return module

    def on_model_ready(self, model: Any) -> None:
        """sentence-transformers' hook once the model holding this module is built. A folder loaded by plain
        ``SentenceTransformer(path, trust_remote_code=True)`` (the advice of sentence-transformers' error) would
        otherwise load without a word: say which call loads it as a contextual model."""
        super().on_model_ready(model)
        self._model_prompts.join(model)
        loaded_from, self._loaded_from = getattr(self, "_loaded_from", None), None
        # Only the model a folder is loaded into: a client that later wraps these modules (LangChain, LlamaIndex)
        # builds its SentenceTransformer from the modules of a ContextualSentenceTransformer on purpose.
        if loaded_from is not None and not hasattr(model, "set_context"):
            warnings.warn(
                f"{loaded_from} is a cde_st model loaded into a plain {type(model).__name__}, which has no "
                "set_context(); with trust_remote_code=True, sentence-transformers would also import a cde_st.py "
                "found in the folder instead of the installed cde_st. Load it with "
                "cde_st.ContextualSentenceTransformer(path) (no trust_remote_code needed); for this model object, "
                "cde_st.set_context(model, corpus_texts) sets the context.",
                UserWarning,
                stacklevel=2,
            )


# A stable class reference in modules.json, independent of the file layout.
ContextualTransformer.__module__ = "cde_st"
