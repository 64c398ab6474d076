"""The context-injection seam: how a backbone embeds tokens and encodes a sequence with a prefix.

Everything model-family specific lives here. :class:`~cde_st.modules.ContextualTransformer` asks a backbone adapter
to run the plain encoder (first stage), to turn token ids into input vectors, and to run the encoder layers over
``[prefix vectors ; text vectors]`` with a joint padding mask and per-row positions.

Positions. Absolute-position encoders (the BERT family) add positions inside their embedding layer, so only the
text gets them; the prefix rows (context vectors, soft prompt) enter after it and carry none. Rotary encoders
(ModernBERT, NomicBERT) rotate queries and keys inside every attention layer; the adapter receives one position
per row of the joint sequence, where ``-1`` means "no rotation" (cos 1, sin 0), which keeps those rows a set.

How text rows read the prefix in cde_st's own attention variants (one softmax, or a gated read with an optional
sink), the same for every family: :mod:`~cde_st.modules.text_attention`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel
from transformers.masking_utils import create_bidirectional_mask, create_bidirectional_sliding_window_mask

from cde_st.modules.text_attention import text_attention

#: Position id of a row that gets no rotary rotation (position-free context rows).
NO_POSITION = -1


class BackboneAdapter:
    """Interface of a backbone family. Stateless: the HF model is passed in on every call."""

    #: ``config.model_type`` values this adapter handles.
    model_types: tuple[str, ...] = ()
    #: Whether positions are rotary (applied per layer, so prefix rows can be given positions or none).
    rotary: bool = False
    #: Extra keyword arguments for ``AutoModel.from_config`` / ``from_pretrained`` of this family.
    model_kwargs: dict = {}

    def forward(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The plain encoder (first stage): (B, L) ids -> (B, L, d) last hidden state."""
        return model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def embed_tokens(
        self, model: PreTrainedModel, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None
    ) -> torch.Tensor:
        """(B, L) token ids -> (B, L, d) encoder inputs (the full embedding stage), text positions from 0."""
        raise NotImplementedError

    def embed_tokens_unnormalised(self, model: PreTrainedModel, input_ids: torch.Tensor) -> torch.Tensor:
        """What the released CDE code got from ``backbone.embeddings(input_ids)`` before handing the joint sequence
        to ``backbone(inputs_embeds=...)``, which runs :meth:`embed_sequence` over it (released-compatible mode)."""
        raise ValueError(f"{type(self).__name__} has no released-compatible (re-embedded joint sequence) mode.")

    def embed_sequence(self, model: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
        """What ``backbone(inputs_embeds=hidden)`` does to its inputs before the first layer."""
        raise ValueError(f"{type(self).__name__} has no released-compatible (re-embedded joint sequence) mode.")

    def input_norm(self, model: PreTrainedModel) -> torch.nn.Module | None:
        """The normalisation applied to M2's input embeddings, if any (to initialise the context head's norm)."""
        return None

    def encode(
        self,
        model: PreTrainedModel,
        hidden: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        num_prefix: int,
        local_attention_scope: str = "text",
    ) -> torch.Tensor:
        """Run the encoder layers over (B, P + L, d) inputs whose first ``num_prefix`` rows are the prefix.

        ``position_ids`` (P + L,) holds one rotary position per row (``NO_POSITION``: no rotation); absolute-position
        backbones ignore it. ``local_attention_scope`` ("text" or "sequence") matters for backbones with
        sliding-window layers: "text" lets every row see the whole prefix and applies the window among text
        tokens; "sequence" applies the window over the joint sequence (the released cde-small-v2).
        """
        raise NotImplementedError

    # ---- cde_st's own attention variants (cached context, context gate), written once over per-family hooks.
    # The hooks take a layer apart: queries/keys/values of some rows (with rotary angles for text rows, none for
    # the position-free prefix), and the rest of the layer given the attended values. The prefix and the text can
    # then attend with different rules while every weight of the pretrained layer is used as it is.

    #: Whether the hooks below are implemented (cached context, context gate).
    split_attention: bool = False

    def _layers(self, model):
        raise ValueError(f"{type(self).__name__} does not implement split (cached / gated) context attention.")

    def _qkv(self, layer, hidden, rope):
        """(B, S, d) -> q, k, v (B, H, S, hd); ``rope`` (cos, sin) rotates q and k (None: no rotation)."""
        raise NotImplementedError

    def _finish(self, layer, attended, hidden):
        """The rest of the layer: attended values (B, H, S, hd) and the layer input (B, S, d) -> layer output."""
        raise NotImplementedError

    def _dropout(self, layer) -> float:
        return 0.0

    def _text_rope(self, model, layer, text):
        """Rotary (cos, sin) of text positions 0..L-1 for ``layer`` (None for absolute-position backbones)."""
        return None

    def _window(self, model, layer) -> int | None:
        """Half-width of ``layer``'s sliding window over the text, or None for global attention."""
        return None

    def _final(self, model, hidden):
        return hidden

    def context_states(
        self, model: PreTrainedModel, context: torch.Tensor, read_layers: list[int] | None = None
    ) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """Per layer, the keys and values of the prefix rows when they attend only to each other:
        (P, d) -> [(k, v)] with k, v (1, heads, P, head_dim). They depend on the corpus alone, so they can be
        computed once per context and reused for every text (``context_attention="cached"``). With
        ``read_layers``, only those layers keep their keys/values (None for the others) and the prefix stops at
        the last of them."""
        layers = list(self._layers(model))
        if read_layers is not None:
            layers = layers[: max(read_layers) + 1]
        hidden, states = context.unsqueeze(0), []
        for i, layer in enumerate(layers):
            q, k, v = self._qkv(layer, hidden, None)
            states.append((k, v) if read_layers is None or i in read_layers else None)
            if i + 1 < len(layers):  # the last layer's output is never read
                attended = F.scaled_dot_product_attention(q, k, v, dropout_p=self._dropout(layer))
                hidden = self._finish(layer, attended, hidden)
        return states

    def encode_split(
        self,
        model: PreTrainedModel,
        context: torch.Tensor,
        text: torch.Tensor,
        text_mask: torch.Tensor,
        cached: list[tuple[torch.Tensor, torch.Tensor] | None] | None,
        gates: torch.Tensor | None,
        read_layers: list[int] | None = None,
        prefix_mask: torch.Tensor | None = None,
        sink: bool = False,
    ) -> torch.Tensor:
        """Encode (B, L, d) text against a (P, d) prefix with cde_st's own attention variants -> (B, L, d).

        ``cached``: the prefix's per-layer keys/values from :meth:`context_states` (context rows attend only to
        context rows; ``context`` may then be None); None: joint attention (prefix rows also attend to the text,
        recomputed per batch).
        ``gates`` (layers, heads) or None: text rows read the prefix through a separate softmax scaled by
        tanh(gate), added to their text-only attention; zero gates give exactly the plain encoder on the text.
        Sliding-window layers apply their window among text tokens; the prefix stays visible to every row.
        ``read_layers``: the layers whose text rows read the prefix (None: all); the others attend to the text only.
        ``prefix_mask`` (B, P) bool or None: which prefix rows each text may read (None: all).
        ``sink``: the gated read's softmax gets a key of score 0 and value 0 (``ContextualConfig.context_sink``).
        """
        batch, length, text_mask = text.shape[0], text.shape[1], text_mask.bool()
        prefix = None if cached is not None else context.unsqueeze(0).expand(batch, -1, -1)
        keys_valid = text_mask[:, None, None, :]  # (B, 1, 1, L)
        if prefix_mask is None:
            prefix_valid = None
            joint_prefix = None if cached is not None else text_mask.new_ones(batch, 1, 1, context.shape[0])
        else:
            prefix_valid = joint_prefix = prefix_mask.bool()[:, None, None, :]  # (B, 1, 1, P)
        offsets = torch.arange(length, device=text.device)
        hidden = text
        for i, layer in enumerate(self._layers(model)):
            p = self._dropout(layer)
            window = self._window(model, layer)
            text_keys = keys_valid
            if window is not None:
                text_keys = keys_valid & ((offsets[:, None] - offsets[None, :]).abs() <= window)[None, None]
            q, k, v = self._qkv(layer, hidden, self._text_rope(model, layer, hidden))
            if cached is None:  # joint: the prefix rows advance through every layer, attending to the text too
                q_pre, k_pre, v_pre = self._qkv(layer, prefix, None)
                joint = torch.cat([joint_prefix, keys_valid], dim=-1)
                attended = F.scaled_dot_product_attention(
                    q_pre, torch.cat([k_pre, k], 2), torch.cat([v_pre, v], 2), attn_mask=joint, dropout_p=p
                )
                prefix = self._finish(layer, attended, prefix)
            if read_layers is not None and i not in read_layers:  # this layer's text reads the text only
                attended = F.scaled_dot_product_attention(q, k, v, attn_mask=text_keys, dropout_p=p)
            else:
                if cached is not None:
                    k_pre, v_pre = cached[i]  # (1, H, P, hd), shared by the batch
                gate = None if gates is None else gates[i]
                attended = text_attention(q, k, v, k_pre, v_pre, text_keys, gate, p, prefix_valid, sink)
            hidden = self._finish(layer, attended, hidden)
        return self._final(model, hidden)


def _heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(B, S, H * hd) -> (B, H, S, hd)."""
    return x.view(*x.shape[:2], -1, head_dim).transpose(1, 2)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, S, hd) -> (B, S, H * hd)."""
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)


class BertAdapter(BackboneAdapter):
    """BERT-family absolute-position encoders (BERT, MiniLM, BGE, E5, GTE, RoBERTa, XLM-R, ELECTRA).

    Positions are added by ``model.embeddings`` to the text alone; the context vectors are concatenated *after*
    the embedding layer, so they carry no position and no token type: the encoder sees them as a set.
    """

    model_types = ("bert", "roberta", "xlm-roberta", "electra", "camembert")
    model_kwargs = {"add_pooling_layer": False}

    def forward(self, model, input_ids, attention_mask, token_type_ids=None):
        return model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state

    def embed_tokens(self, model, input_ids, token_type_ids):
        return model.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)

    def input_norm(self, model):
        return getattr(model.embeddings, "LayerNorm", None)

    def encode(self, model, hidden, attention_mask, position_ids, num_prefix, local_attention_scope="text"):
        # A 2-D padding mask becomes whatever the configured attention implementation wants
        # (4-D additive mask for eager, boolean for SDPA, None/unpadding info for flash-attention).
        mask = create_bidirectional_mask(config=model.config, inputs_embeds=hidden, attention_mask=attention_mask)
        return model.encoder(hidden, attention_mask=mask).last_hidden_state

    split_attention = True

    # A BertLayer is: self-attention (query/key/value), attention.output (dense, dropout, residual, LayerNorm),
    # intermediate and output (FFN, residual, LayerNorm). The split paths below reuse those modules as they are.
    def _layers(self, model):
        return model.encoder.layer

    def _qkv(self, layer, hidden, rope):
        attn = layer.attention.self
        return [_heads(proj(hidden), attn.attention_head_size) for proj in (attn.query, attn.key, attn.value)]

    def _finish(self, layer, attended, hidden):
        out = layer.attention.output(_merge_heads(attended), hidden)
        return layer.output(layer.intermediate(out), out)

    def _dropout(self, layer) -> float:
        return layer.attention.self.dropout.p if layer.training else 0.0


def _rotate(x: torch.Tensor, rope) -> torch.Tensor:
    """Rotary embedding (rotate-half convention) of (B, H, S, hd) with cos/sin (1, S, hd); None: unchanged."""
    if rope is None:
        return x
    cos, sin = (t.unsqueeze(1) for t in rope)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def _rotary(cos_sin: tuple[torch.Tensor, torch.Tensor], position_ids: torch.Tensor):
    """Make rows with ``NO_POSITION`` rotate by zero (cos 1, sin 0): their queries and keys pass unchanged."""
    cos, sin = cos_sin
    free = (position_ids < 0).view(1, -1, 1)
    return torch.where(free, torch.ones_like(cos), cos), torch.where(free, torch.zeros_like(sin), sin)


class NomicBertAdapter(BackboneAdapter):
    """NomicBERT (``nomic_bert``; cde-small-v1's backbone): post-norm blocks, SwiGLU, rotary positions along the
    sequence. Its embedding stage is ``LayerNorm(word + token_type)``."""

    model_types = ("nomic_bert",)
    rotary = True

    def embed_tokens(self, model, input_ids, token_type_ids):
        return model.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)

    def embed_tokens_unnormalised(self, model, input_ids):
        # NomicBERT's own embedding module (as the released code called it) is word + token_type[0], without emb_ln.
        emb = model.embeddings
        return emb.word_embeddings(input_ids) + emb.token_type_embeddings(torch.zeros_like(input_ids))

    def embed_sequence(self, model, hidden):
        return model.embeddings(inputs_embeds=hidden)  # LayerNorm(hidden + token_type[0])

    def input_norm(self, model):
        return model.embeddings.LayerNorm

    def encode(self, model, hidden, attention_mask, position_ids, num_prefix, local_attention_scope="text"):
        mask = create_bidirectional_mask(config=model.config, inputs_embeds=hidden, attention_mask=attention_mask)
        cos_sin = _rotary(model.rotary_emb(hidden, position_ids.clamp(min=0).unsqueeze(0)), position_ids)
        for layer in model.layers[: model.config.num_hidden_layers]:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=cos_sin)
        return hidden

    split_attention = True

    def _layers(self, model):
        return model.layers[: model.config.num_hidden_layers]

    def _qkv(self, layer, hidden, rope):
        attn = layer.self_attn
        q, k, v = (_heads(proj(hidden), attn.head_dim) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        return _rotate(q, rope), _rotate(k, rope), v

    def _finish(self, layer, attended, hidden):
        hidden = layer.post_attention_layernorm(
            hidden + layer.post_attention_dropout(layer.self_attn.o_proj(_merge_heads(attended)))
        )
        return layer.post_mlp_layernorm(hidden + layer.post_mlp_dropout(layer.mlp(hidden)))

    def _dropout(self, layer) -> float:
        return layer.self_attn.attention_dropout if layer.training else 0.0

    def _text_rope(self, model, layer, text):
        return model.rotary_emb(text, torch.arange(text.shape[1], device=text.device).unsqueeze(0))


class ModernBertAdapter(BackboneAdapter):
    """ModernBERT (``modernbert``; cde-small-v2's backbone): pre-norm blocks, GeGLU, rotary positions with one
    theta for global and one for local (sliding-window) layers, a final norm. Its embedding stage is
    ``LayerNorm(tok)``."""

    model_types = ("modernbert",)
    rotary = True

    def embed_tokens(self, model, input_ids, token_type_ids):
        return model.embeddings(input_ids=input_ids)

    def embed_tokens_unnormalised(self, model, input_ids):
        # ModernBERT's embedding module already normalises: the released code normalised the text twice.
        return model.embeddings(input_ids=input_ids)

    def embed_sequence(self, model, hidden):
        return model.embeddings(inputs_embeds=hidden)  # LayerNorm(hidden)

    def input_norm(self, model):
        return model.embeddings.norm

    def encode(self, model, hidden, attention_mask, position_ids, num_prefix, local_attention_scope="text"):
        config = model.config
        masks = {"full_attention": create_bidirectional_mask(config, hidden, attention_mask)}
        if "sliding_attention" in config.layer_types:
            if local_attention_scope == "sequence":
                masks["sliding_attention"] = create_bidirectional_sliding_window_mask(config, hidden, attention_mask)
            else:
                # The window applies among text tokens; every row sees every prefix row and vice versa.
                def prefix_visible(batch_idx, head_idx, q_idx, kv_idx):
                    return (q_idx < num_prefix) | (kv_idx < num_prefix)

                masks["sliding_attention"] = create_bidirectional_sliding_window_mask(
                    config, hidden, attention_mask, or_mask_function=prefix_visible
                )
        positions = position_ids.clamp(min=0).unsqueeze(0)
        cos_sin = {t: _rotary(model.rotary_emb(hidden, positions, t), position_ids) for t in set(config.layer_types)}
        for layer in model.layers:
            hidden = layer(
                hidden,
                attention_mask=masks[layer.attention_type],
                position_embeddings=cos_sin[layer.attention_type],
            )
        return model.final_norm(hidden)

    split_attention = True

    def _layers(self, model):
        return model.layers

    def _qkv(self, layer, hidden, rope):
        attn = layer.attn
        qkv = attn.Wqkv(layer.attn_norm(hidden)).view(*hidden.shape[:2], 3, -1, attn.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=2))
        return _rotate(q, rope), _rotate(k, rope), v

    def _finish(self, layer, attended, hidden):
        hidden = hidden + layer.attn.out_drop(layer.attn.Wo(_merge_heads(attended)))
        return hidden + layer.mlp(layer.mlp_norm(hidden))

    def _dropout(self, layer) -> float:
        return layer.attn.attention_dropout if layer.training else 0.0

    def _text_rope(self, model, layer, text):
        positions = torch.arange(text.shape[1], device=text.device).unsqueeze(0)
        return model.rotary_emb(text, positions, layer.attention_type)

    def _window(self, model, layer):
        return model.config.sliding_window if layer.attention_type == "sliding_attention" else None

    def _final(self, model, hidden):
        return model.final_norm(hidden)


_ADAPTERS: list[BackboneAdapter] = [BertAdapter(), NomicBertAdapter(), ModernBertAdapter()]


def get_adapter(model_type: str) -> BackboneAdapter:
    """The adapter for a HF ``config.model_type``; a clear error for unsupported families."""
    for adapter in _ADAPTERS:
        if model_type in adapter.model_types:
            return adapter
    supported = sorted(t for a in _ADAPTERS for t in a.model_types)
    raise ValueError(
        f"Backbone type {model_type!r} is not supported yet; supported: {sorted(supported)}. "
        "Add a BackboneAdapter in cde_st/modules/backbone.py for it."
    )
