"""Tokenising a request before it reaches the model's thread, and the features of a forward built from requests.

A request is tokenised when it arrives (:class:`RequestTokenizer`; a short one on the event loop, a longer one in
the engine's tokenizer thread, each with its own tokenizer copy): its texts
are first cut by :func:`cde_st.text_bounds.bound_text` (a 5 MB text costs a few KB of tokenising and memory), then
counted (how many tokens each has, so an over-long input is refused or reported as truncated without a second
tokenising of the whole text) and turned into the model's features. The model's thread only pads the features of
the requests batched together (:func:`forward_features`), sorted by length as ``encode`` sorts them.

The tokenizer thread works on its own copy of the tokenizer: a fast tokenizer whose truncation settings change in
one thread while another encodes raises "Already borrowed", and the model's thread tokenises too (the first stage
of a new context). The features must be what ``model.preprocess`` gives, so a server answer equals ``encode``: at
start the copy's features are compared with ``preprocess`` on probe texts for every prompt; a model where they
differ (another input module, left padding) is tokenised by ``preprocess`` in the model's thread instead.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from cde_st.modules.batch_plan import longest_first_order, plan_batches
from cde_st.text_bounds import bound_texts

__all__ = ["RequestTokenizer", "Tokens", "forward_features", "pad_values"]

logger = logging.getLogger(__name__)

_PROBES = ["a", "what causes rain?", " ".join(["word"] * 600)]


@dataclass
class Tokens:
    """One request's texts, tokenised. ``texts``: the (bounded) texts; ``lengths``: tokens the model reads per text;
    ``counted``: tokens per text before truncation (a lower bound where ``cut``: the text was longer still);
    ``features``: the model's features for the request (None: ``preprocess`` runs in the model's thread)."""

    texts: list[str]
    prompt: str
    lengths: np.ndarray
    counted: np.ndarray
    cut: np.ndarray
    features: dict | None

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def truncated(self) -> np.ndarray:
        """Per text: whether the model reads only part of it."""
        return self.counted > self.lengths

    @property
    def longest(self) -> int:
        return int(self.lengths.max()) if len(self.lengths) else 0


class RequestTokenizer:
    """Tokenises requests for ``model`` (a SentenceTransformer) exactly as its ``preprocess`` does, truncating at
    ``max_seq_length``; ``prompts`` are the prompt texts requests may get (checked at construction)."""

    def __init__(self, model, max_seq_length: int, prompts: Sequence[str]) -> None:
        self.model, self.max_seq_length = model, max_seq_length
        self.tokenizer = copy.deepcopy(model.tokenizer)
        self._constants: dict[str, dict] = {}
        self._pads = pad_values(self.tokenizer)
        self.exact = all(self._check(prompt) for prompt in dict.fromkeys(prompts))
        if not self.exact:
            logger.warning("The model's preprocess differs from its tokenizer's: requests are tokenised in its thread.")

    def _check(self, prompt: str) -> bool:
        """Whether the copy's features for ``prompt`` equal ``preprocess``'s; keeps the features that are not
        per-token (``prompt_length``, ``modality``) to add to every request's."""
        if self.tokenizer.padding_side != "right" or self.tokenizer.pad_token_id is None:
            return False
        try:
            expected = dict(self.model.preprocess(_PROBES, prompt=prompt))
        except Exception:
            return False
        got = self._encode(_PROBES, prompt)
        constants = {k: v for k, v in expected.items() if k not in got}
        if any(isinstance(v, torch.Tensor) and v.dim() > 1 for v in constants.values()) or set(got) - set(expected):
            return False
        if not all(torch.equal(got[k], expected[k]) for k in got) or set(got) - set(self._pads):
            return False
        # Texts within the limit take the other path (their count's ids, padded here): it must agree too.
        short = _PROBES[:2]
        expected = dict(self.model.preprocess(short, prompt=prompt))
        _, got = self._features(short, prompt, exact=True)
        if set(got) != set(expected) - set(constants) or not all(torch.equal(got[k], expected[k]) for k in got):
            return False
        self._constants[prompt] = constants
        return True

    def _features(self, texts: Sequence[str], prompt: str, exact: bool) -> tuple[np.ndarray, dict | None]:
        """Tokens per text before truncation, and (``exact``) the features: texts all within ``max_seq_length``
        are tokenised once (the count's ids, padded here), a longer one a second time with truncation."""
        whole = self.tokenizer([prompt + t for t in texts], truncation=False, verbose=False)
        counted = np.array([len(row) for row in whole["input_ids"]], dtype=np.int64)
        if not exact:
            return counted, None
        if counted.max(initial=0) > self.max_seq_length or set(whole) - set(self._pads):
            return counted, self._encode(list(texts), prompt)
        width = int(counted.max(initial=0))
        features = {}
        for key, rows in whole.items():
            padded = np.full((len(rows), width), self._pads[key], dtype=np.int64)
            for i, row in enumerate(rows):
                padded[i, : len(row)] = row
            features[key] = torch.from_numpy(padded)
        return counted, features

    def _encode(self, texts: list[str], prompt: str) -> dict:
        prompted = [prompt + t for t in texts]
        kwargs = dict(padding=True, truncation="longest_first", max_length=self.max_seq_length, return_tensors="pt")
        return dict(self.tokenizer(prompted, **kwargs))

    def tokenize(self, texts: Sequence[str], prompt: str) -> Tokens:
        """Cut, count and (when exact) tokenise one request's ``texts`` with ``prompt`` prepended; runs in the
        tokenizer thread, never two calls at a time."""
        bounded = bound_texts(texts, self.max_seq_length, self.tokenizer)
        cut = np.array([len(b) < len(t) for b, t in zip(bounded, texts)], dtype=bool)
        # The bounded texts are short, so counting them whole is cheap: an exact count of every text not cut.
        counted, features = self._features(bounded, prompt, self.exact)
        if features is not None:
            features.update(self._constants[prompt])  # every prompt a request can get was checked at start
        lengths = np.minimum(counted, self.max_seq_length)
        return Tokens(bounded, prompt, lengths, counted, cut, features)


def pad_values(tokenizer) -> dict:
    """The value each per-token feature is right-padded with."""
    return {
        "input_ids": tokenizer.pad_token_id,
        "attention_mask": 0,
        "token_type_ids": getattr(tokenizer, "pad_token_type_id", 0),
    }


def forward_features(
    model,
    parts: Sequence[Tokens],
    max_batch_size: int,
    max_batch_tokens: int | None = None,
    overhead_tokens: float | None = None,
) -> Iterator[tuple[np.ndarray, dict]]:
    """The forwards of a batch of requests (in the model's thread or process): (positions of the texts in the batch,
    their features), longest texts first, each of at most ``max_batch_size`` texts and, when given,
    ``max_batch_tokens`` tokens counted with padding (texts times the longest; one text at least). With
    ``overhead_tokens`` (what one more forward costs, in padded tokens) the sorted texts are cut where padding
    would cost more than another forward; without it, as full as allowed (the plan encode_fast follows too:
    :func:`cde_st.modules.batch_plan.plan_batches`). Needs only ``model`` (its tokenizer's pad values, its
    ``preprocess`` for requests tokenised without features), not a :class:`RequestTokenizer`."""
    lengths = np.concatenate([part.lengths for part in parts])
    order = longest_first_order(lengths)
    pads = pad_values(model.tokenizer)
    merged = _merge(parts, pads) if all(p.features is not None for p in parts) else None
    texts = [t for part in parts for t in part.texts]
    for start, stop in plan_batches(lengths[order], max_batch_size, max_batch_tokens, overhead_tokens):
        positions = order[start:stop]
        if merged is None:
            features = dict(model.preprocess([texts[i] for i in positions], prompt=parts[0].prompt))
        else:
            width = int(lengths[positions].max())
            index = torch.as_tensor(positions)
            features = {k: v[index, :width] if k in pads else v for k, v in merged.items()}
        yield positions, features


def _merge(parts: Sequence[Tokens], pads: dict) -> dict:
    """The requests' features as one padded batch (right padding with the tokenizer's pad values)."""
    width = max(part.features["input_ids"].shape[1] for part in parts)
    merged = dict(parts[0].features)
    for key, pad in pads.items():
        if key not in merged:
            continue
        rows = [
            torch.nn.functional.pad(p.features[key], (0, width - p.features[key].shape[1]), value=pad) for p in parts
        ]
        merged[key] = torch.cat(rows)
    return merged
