"""The small learned parts a contextual model adds around its two encoders: the first-stage and output heads, the
soft prompt of the released models, and the mean pooling both stages use."""

from __future__ import annotations

import torch
from torch import nn


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, L, d), (B, L) -> (B, d): mean over positions where mask is 1 (zero vector if none)."""
    mask = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


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
