"""The small learned parts a contextual model adds around its two encoders: the first-stage and output heads, the
null vector, the context gates, the soft prompt of the released models (:func:`build_added_parameters` makes all of
them), and the mean pooling both stages use (with :func:`pool_mask`, the positions the second stage pools)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, L, d), (B, L) -> (B, d): mean over positions where mask is 1 (zero vector if none)."""
    mask = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


class MeanPool(nn.Module):
    """Mean pooling as a module (no parameters): the pooling of ``pooling="mean"``. Every pool takes the call's
    context vectors and context mask too; this one reads neither."""

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor, vectors=None, context_mask=None) -> torch.Tensor:
        return mean_pool(hidden, mask)


class WeightedPool(nn.Module):
    """Pooling with a weight per token, ``exp(w . h_t + b)``, normalised over the pooled positions (``pooling=
    "weighted"``). ``w`` and ``b`` start at zero, so an untrained pool is exactly mean pooling. A token's weight can
    then follow what its state holds, the context read included: how common its word is in the corpus."""

    def __init__(self, width: int):
        super().__init__()
        self.score = nn.Linear(width, 1)
        nn.init.zeros_(self.score.weight)
        nn.init.zeros_(self.score.bias)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor, vectors=None, context_mask=None) -> torch.Tensor:
        return softmax_pool(hidden, mask, self.score(hidden).squeeze(-1))


def softmax_pool(hidden: torch.Tensor, mask: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """(B, L, d) states, (B, L) mask and (B, L) scores -> (B, d): the states weighted by the softmax of the scores
    over the pooled positions (a row with no position pools to zeros)."""
    scores = scores.float().masked_fill(~mask.bool(), float("-inf"))
    weights = torch.softmax(scores, dim=1).nan_to_num(0.0).to(hidden.dtype)
    return (hidden * weights.unsqueeze(-1)).sum(1)


class ContextWeightedPool(nn.Module):
    """Pooling in which a token's weight follows how much its state has in common with the corpus (``pooling=
    "context"``): ``exp(-a * h_t . m / |m|)``, ``m`` the mean of the context vectors the row may read, ``a`` learned
    and zero at the start (an untrained pool is the mean; so is a call with no context).

    Why a mean and not attention: with near-orthogonal word vectors a document's pooled vector projects on a word's
    vector in proportion to whether it holds the word, so the mean of J such vectors projects in proportion to how
    many of the J documents hold it, its document frequency, which is what a word's weight in this corpus is made
    of. An attention read cannot count: its softmax normalises the matching rows' number away, and one corpus's
    rows are so alike (cosine 0.9-1.0 between their keys) that a token cannot pick out the ones that hold its word."""

    def __init__(self):
        super().__init__()
        self.strength = nn.Parameter(torch.zeros(()))

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor, vectors=None, context_mask=None) -> torch.Tensor:
        if vectors is None or len(vectors) == 0:
            return mean_pool(hidden, mask)
        vectors = vectors.to(hidden.dtype)
        if context_mask is None:
            means = vectors.mean(dim=0).expand(hidden.shape[0], -1)  # (B, d)
        else:
            visible = context_mask.to(hidden.dtype)  # (B, J')
            means = visible @ vectors / visible.sum(dim=1, keepdim=True).clamp_min(1.0)
        direction = means / means.norm(dim=-1, keepdim=True).clamp_min(1e-6)  # a row that reads nothing: 0
        scores = -self.strength * torch.einsum("bld,bd->bl", hidden, direction)
        return softmax_pool(hidden, mask, scores)


class Head(nn.Module):
    """Linear -> activation -> Linear, optionally residual. With ``residual`` the last layer starts at zero,
    so an untrained head is the identity and a model built from a pretrained encoder starts as that encoder."""

    def __init__(self, d_in: int, d_out: int, activation: str, residual: bool):
        super().__init__()
        if residual and d_in != d_out:
            raise ValueError(f"A residual head needs equal input and output widths, got {d_in} -> {d_out}.")
        self.residual = residual
        self.fc1 = nn.Linear(d_in, d_out)
        self.act = nn.GELU() if activation == "gelu" else nn.ReLU()
        self.fc2 = nn.Linear(d_out, d_out)
        if residual:
            nn.init.zeros_(self.fc2.weight)
            nn.init.zeros_(self.fc2.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc2(self.act(self.fc1(x)))
        return x + out if self.residual else out


class SoftPrompt(nn.Module):
    """``n`` learned prompt vectors between the context and the text: ``projection(ones(d))`` reshaped to (n, d),
    with projection = Linear(d, d) -> ReLU -> Linear(d, n * d), as in the released CDE models."""

    def __init__(self, d: int, n: int):
        super().__init__()
        self.n = n
        self.projection = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, n * d))

    def forward(self) -> torch.Tensor:
        weight = self.projection[0].weight
        return self.projection(weight.new_ones(weight.shape[1])).view(self.n, -1)  # (n, d)


def build_added_parameters(
    config: Any, first_stage: PreTrainedModel, second_stage: PreTrainedModel, second_adapter: Any, pad_id: int
) -> dict[str, nn.Module | nn.Parameter | None]:
    """The parts cde_st adds to the two encoders, by attribute name: ``context_head``, ``null_vector``,
    ``soft_prompt``, ``gates``, ``head``, ``pool``. Made in this order, which fixes how a seeded construction draws
    their initial values (and the order the module registers them in). ``config``: the module's ``ContextualConfig``;
    ``second_adapter``: the second stage's backbone adapter; ``pad_id``: the tokenizer's padding id."""
    config2 = second_stage.config
    d1, d2 = first_stage.config.hidden_size, config2.hidden_size
    if config.first_stage_head == "mlp":
        head = Head(d1, d2, "gelu", residual=config.first_stage_residual and d1 == d2)
    else:
        head = nn.Identity()
    if config.first_stage_norm:
        # Context rows replace token embeddings at M2's input: normalise them like M2's embedding layer does
        # (initialised from it), so a model built from a pretrained encoder starts close to in-distribution.
        source = second_adapter.input_norm(second_stage)
        if source is not None:
            norm = nn.LayerNorm(d2, eps=source.eps, bias=source.bias is not None)
            norm.load_state_dict(source.state_dict())
        else:
            norm = nn.LayerNorm(d2, eps=getattr(config2, "layer_norm_eps", 1e-12))
        head = nn.Sequential(head, norm)
    added: dict[str, nn.Module | nn.Parameter | None] = {"context_head": head}
    # The null slot starts as M2's own [PAD] embedding, which pretrained encoders learn to attend past.
    with torch.no_grad():
        pad = second_adapter.embed_tokens(second_stage, torch.tensor([[pad_id]]), None)[0, 0]
    added["null_vector"] = nn.Parameter(pad.detach().clone())
    added["soft_prompt"] = SoftPrompt(d2, config.soft_prompt_tokens) if config.soft_prompt_tokens else None
    added["gates"] = (
        nn.Parameter(torch.zeros(config2.num_hidden_layers, config2.num_attention_heads))
        if config.context_gate
        else None
    )
    added["head"] = (
        nn.Identity()
        if config.output_head == "none"
        else Head(d2, d2, "relu", residual=config.output_head == "residual_mlp")
    )
    pools = {"mean": MeanPool, "weighted": lambda: WeightedPool(d2), "context": ContextWeightedPool}
    added["pool"] = pools[config.pooling]()
    return added


def instruction_token_id(tokenizer: Any, instruction: str | None) -> int | None:
    """The token id that ends a task instruction (``pool_skip_instruction``: its first token), None without one."""
    if instruction is None:
        return None
    ids = tokenizer.encode(instruction, add_special_tokens=False)
    if not ids:
        raise ValueError(f"pool_skip_instruction={instruction!r} tokenises to nothing.")
    return ids[0]


def pool_mask(
    features: dict[str, torch.Tensor], include_prompt: bool, instruction_token_id: int | None
) -> torch.Tensor:
    """(B, L) mask of the text positions mean pooling reads: not padding, not the prompt (``include_prompt=False``
    with a ``prompt_length`` feature), not the task instruction (positions up to the first later occurrence of
    ``instruction_token_id``, the ``pool_skip_instruction`` delimiter)."""
    input_ids, mask = features["input_ids"], features["attention_mask"]
    prompt_length = features.get("prompt_length")
    if not include_prompt and prompt_length is not None:
        pl = int(prompt_length[0]) if isinstance(prompt_length, torch.Tensor) else int(prompt_length)
        mask = mask.clone()
        mask[:, :pl] = 0
    if instruction_token_id is None:
        return mask
    # Drop positions 0..p, p the first position > 0 holding the instruction delimiter (if any).
    hits = (input_ids == instruction_token_id) & mask.bool()
    hits[:, 0] = False
    found = hits.any(dim=1, keepdim=True)
    end = hits.int().argmax(dim=1, keepdim=True)
    positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
    return mask * ~(found & (positions <= end))
