"""The false-negative filter of :class:`~cde_st.losses.FilteredInfoNCELoss`: a frozen guide model decides which
in-batch candidates are too relevant to a row to serve as its negatives.

Clustered batches put similar pairs together, so a query's in-batch "negatives" often include duplicates of its
positive or other relevant documents. The guide (by default the offline all-MiniLM-L6-v2) embeds the texts behind
the model's tokens, and every candidate it scores at least as relevant as the row's own positive is removed from
that row's softmax denominator (Morris & Rush, ICLR 2025, Section 4; the same rule as GISTEmbed's).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from sentence_transformers import SentenceTransformer
from sentence_transformers.util import batch_to_device, cos_sim
from torch import Tensor

from cde_st.defaults import load_default_surrogate

# Guide scores of identical texts can differ in the last float bit; "as relevant as the positive" must catch them.
_SCORE_TOLERANCE = 1e-6


def false_negative_mask(
    guide_queries: Tensor,
    guide_documents: Tensor,
    margin: float = 0.0,
    positive_index: Tensor | None = None,
    positive_scores: Tensor | None = None,
) -> Tensor:
    """Which candidates a frozen guide marks as likely false negatives.

    Row i (a query, or a document in the bidirectional loss) and candidate j are scored by the guide's cosine
    similarity f(i, j). Candidate j is removed from row i's denominator when

        f(i, j) >= f(q_i, d_i) - margin

    where f(q_i, d_i) is the guide's score of row i's own positive pair: column ``positive_index[i]`` of this
    matrix, or ``positive_scores[i]`` when given (same-side candidates, where the positive is not a column).
    The positive columns ``positive_index`` are never removed.

    Args:
        guide_queries: (n, d_g) guide embeddings of the rows.
        guide_documents: (m, d_g) guide embeddings of the candidates.
        margin: how far below the positive's score a candidate is still removed (0 = only candidates at least as
            relevant as the positive).
        positive_index: (n,) column of each row's positive, or None.
        positive_scores: (n,) guide score f(q_i, d_i) of each row's positive pair, or None (then read from
            ``positive_index``).

    Returns:
        (n, m) bool tensor, True where the logit must be removed (set to -inf).

    Example:
        >>> g = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]), dim=-1)
        >>> false_negative_mask(g, g, positive_index=torch.arange(3))  # rows 0 and 2 are duplicates
        tensor([[False, False,  True],
                [False, False, False],
                [ True, False, False]])
    """
    if positive_index is None and positive_scores is None:
        raise ValueError("Give positive_index or positive_scores: the threshold is the positive pair's guide score.")
    scores = cos_sim(guide_queries, guide_documents)  # (n, m)
    rows = torch.arange(scores.shape[0], device=scores.device)
    if positive_scores is None:
        positive_scores = scores[rows, positive_index]
    mask = scores >= (positive_scores.to(scores.dtype) - margin - _SCORE_TOLERANCE).unsqueeze(1)
    if positive_index is not None:
        mask[rows, positive_index] = False
    return mask


def resolve_guide(
    guide: SentenceTransformer | bool | None, model: SentenceTransformer, filter_false_negatives: bool = True
) -> SentenceTransformer | None:
    """The guide a loss should use, frozen and in eval mode, or None when filtering is off.

    ``guide`` None or True means the default guide (the offline all-MiniLM-L6-v2, on the model's device); False,
    or ``filter_false_negatives=False``, means no filtering (no guide is loaded). The guide reads the texts decoded
    from the model's tokens, so the model needs a tokenizer; it must be a separate model, never the one trained.
    """
    if not filter_false_negatives or guide is False:
        return None
    if guide is None or guide is True:
        guide = load_default_surrogate(device=str(model.device))
    if guide is model:
        raise ValueError("The guide must be a separate, frozen model, not the model being trained.")
    if not hasattr(model, "tokenizer") or model.tokenizer is None:
        raise ValueError("False-negative filtering decodes the model's tokens: the model needs a tokenizer.")
    guide.eval()
    guide.requires_grad_(False)
    return guide


def guide_embeddings(
    guide: SentenceTransformer, tokenizer: Any, columns: list[dict[str, Any]], chunk_size: int = 128
) -> list[Tensor]:
    """Normalised guide embeddings (B, d_g) of each column, from the texts behind the column's tokens.

    The guide sees the texts without the model's prompt (it has its own conventions) and embeds them without
    grad, ``chunk_size`` texts at a time; the result is on the column's device, in float32.
    """
    guide.eval()
    out = []
    for feature in columns:
        texts = _decode_texts(feature, tokenizer)
        vectors = []
        with torch.no_grad():
            for start in range(0, len(texts), chunk_size):
                guide_features = batch_to_device(guide.preprocess(texts[start : start + chunk_size]), guide.device)
                vectors.append(guide(guide_features)["sentence_embedding"].float())
        out.append(F.normalize(torch.cat(vectors), dim=-1).to(feature["input_ids"].device))
    return out


def _decode_texts(features: dict[str, Any], tokenizer: Any) -> list[str]:
    """The texts behind a column's tokens, without the prompt (the guide has its own conventions)."""
    ids = features["input_ids"]
    start = 0
    prompt_length = features.get("prompt_length")
    if prompt_length is not None and getattr(tokenizer, "padding_side", "right") == "right":
        # [CLS] + prompt tokens come first; skip_special_tokens drops [SEP]/[PAD] behind the text.
        start = int(prompt_length.flatten()[0]) if isinstance(prompt_length, Tensor) else int(prompt_length)
    return tokenizer.batch_decode(ids[:, start:], skip_special_tokens=True)
