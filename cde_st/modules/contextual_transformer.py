"""ContextualTransformer: the two-stage contextual document encoder as one sentence-transformers input module.

Stage 1 (M1, "dataset encoder") embeds J corpus documents into J context vectors:
    tokens -> M1 encoder -> mean pool -> MLP head                      (J, d2)
Stage 2 (M2) embeds a query or document *given* those vectors:
    [c_1 .. c_J ; e(t_1) .. e(t_L)] -> M2 encoder -> mean pool over t   (B, d2)
The context rows enter after the embedding layer, so they have no position: the context is a set. A learned null
vector fills empty slots (fewer than J documents, sequence dropout, or no context at all).

This file is the module itself, top to bottom: construction from a :class:`ContextualConfig`, prompts,
tokenisation, the first stage, the second stage's forward, save/load. Its collaborators each have their own file:
the settings and their rules (``contextual_config.py``), the context lifecycle (``context_state.py``), the text's
attention over the context (``context_attention.py``), the backbone families (``backbone.py``), the folder
integrity checks (``integrity.py``) and what a source encoder's folder does (``source_pipeline.py``).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_model
from sentence_transformers.base.modules import InputModule
from sentence_transformers.util import load_file_path
from torch import nn
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from cde_st.context import validate_texts
from cde_st.modules.backbone import get_adapter
from cde_st.modules.caller import caller_stacklevel
from cde_st.modules.context_attention import ContextAttention
from cde_st.modules.context_state import CONTEXT_FILE, ContextState
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
from cde_st.modules.owner_prompts import OwnerPrompts
from cde_st.modules.source_pipeline import SourcePipeline, read_source_pipeline

# What ContextualTransformer.from_encoder builds unless told otherwise: the `mini` training preset's recipe
# (cde_st/training/presets/mini.yaml; docs/experiment_log.md, issues 11-12), which starts as its source encoder. ContextualConfig's own
# defaults (joint attention, heads) stay those of the paper, so folders saved without these fields load unchanged.
SOURCE_START: dict[str, Any] = {
    "context_attention": "cached",
    "context_gate": True,
    "output_head": "none",
    "first_stage_head": "none",
}
SOURCE_START_READING_LAYERS = 3  # the top 3 second-stage layers read the context (MiniLM: [3, 4, 5])


def _config_field(name: str) -> property:
    return property(lambda self: getattr(self.config, name), doc=f"``config.{name}`` (see ContextualConfig).")


class ContextualTransformer(ContextState, ContextAttention, OwnerPrompts, InputModule):
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
        self._prompts = {
            name: value for name, value in (("query", query_prompt), ("document", document_prompt)) if value is not None
        }
        self._instruction_token_id = None
        if config.pool_skip_instruction is not None:
            ids = tokenizer.encode(config.pool_skip_instruction, add_special_tokens=False)
            if not ids:
                raise ValueError(f"pool_skip_instruction={config.pool_skip_instruction!r} tokenises to nothing.")
            self._instruction_token_id = ids[0]
        self._build_added_parameters()
        self._init_context_attention()
        self._init_context_state()
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
        source: the recipe of the ``mini`` training preset (:data:`SOURCE_START`: cached context read through a
        zero-initialised gate by the top three second-stage layers, no added heads), so untrained it gives the
        encoder's embeddings whatever the context. ``context_attention="joint"`` gives the paper's joint attention
        with :class:`ContextualConfig`'s defaults (an untrained model then mixes the context into every text:
        issue 23). Any field given wins over these defaults.
        """
        source = read_source_pipeline(name_or_path) if source is None else source
        start_as_source = "context_attention" not in fields and not (
            fields.get("embed_joint_sequence") or fields.get("prefix_positions", "none") != "none"
        )
        if start_as_source:
            fields = {**SOURCE_START, **fields}
        if source.pooling_mode != "mean":
            warnings.warn(
                f"{name_or_path!r} pools with {source.pooling_mode!r}; the contextual model mean-pools its second "
                "stage, so it does not start with that encoder's embeddings.",
                UserWarning,
                stacklevel=caller_stacklevel(),
            )
        first, second, tokenizer = load_pretrained_pair(source.model_dir, fields.get("attn_implementation", "auto"))
        if start_as_source and "context_layers" not in fields:
            num_layers = second.config.num_hidden_layers
            fields["context_layers"] = list(range(max(0, num_layers - SOURCE_START_READING_LAYERS), num_layers))
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

    # ------------------------------------------------------------------ tokenisation
    def _tokenize(self, texts: list[str], max_length: int) -> dict[str, torch.Tensor]:
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
        order = np.argsort([-len(t) for t in texts], kind="stable")
        chunks = []
        starts = range(0, len(texts), batch_size)
        for start in tqdm(starts, desc="Context (first stage)", disable=not show_progress_bar):
            batch = [texts[i] for i in order[start : start + batch_size]]
            features = {k: v.to(self.device) for k, v in self.preprocess_context(batch).items()}
            chunks.append(self.embed_context_features(features).float())
        self.train(was_training)
        if not chunks:
            return torch.zeros(0, self.hidden_size, device=self.device)
        vectors = torch.cat(chunks)
        return vectors[torch.as_tensor(np.argsort(order), device=vectors.device)]

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
        input_ids, attention_mask = features["input_ids"], features["attention_mask"]
        adapter, backbone = self.second_adapter, self.second_stage
        if self.embed_joint_sequence:
            text = adapter.embed_tokens_unnormalised(backbone, input_ids)
        else:
            text = adapter.embed_tokens(backbone, input_ids, features.get("token_type_ids"))
        prefix = self._context_slots(context_vectors, text.dtype)  # (J, d2)
        num_ctx = prefix.shape[0]
        if self.soft_prompt is not None:
            prefix = torch.cat([prefix, self.soft_prompt().to(text.dtype)])  # (J + n_prompt, d2)
        prefix_mask = None
        if context_mask is not None:
            prefix_mask = self._prefix_mask(context_mask, len(context_vectors), input_ids.shape[0], prefix.shape[0])
        reusable = context_vectors is None and not self.training
        out = self._attend(prefix, num_ctx, text, attention_mask, prefix_mask, reusable)
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
            self._drop_context_cache()  # weights are about to change
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
