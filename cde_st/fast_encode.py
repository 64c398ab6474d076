"""encode_fast: ``encode_query`` / ``encode_document`` with the host's work taken off the device's critical path.

sentence-transformers' ``encode`` sorts the inputs by character count, then for each batch tokenises it, copies it
to the device, runs the forward and copies the embeddings back (``.cpu()``, which waits for the device). On a GPU the
device then idles while the host tokenises the next batch, and a larger batch does not help. :func:`encode_fast`
gives the same embeddings (same prompts, truncation, normalisation, output order and types) for any
sentence-transformers model whose input module tokenises text with padding to the longest row (``Transformer``,
cde_st's ``ContextualTransformer``), but:

- tokenises ahead, ``chunk_size`` texts per call of the model's own ``preprocess`` (so the fast tokenizer sees many
  texts at once), in a background thread while the device works on the previous chunk;
- sorts each chunk by token count and cuts batches of at most ``batch_size`` rows and, with ``batch_tokens``, at most
  that many padded tokens (rows x longest row), so padding is small and short texts go in larger batches (the plan
  the server follows too: :func:`cde_st.modules.batch_plan.plan_batches`);
- packs every batch of a chunk into one flat buffer per feature (pinned on CUDA) and copies it to the device in one
  non-blocking copy;
- keeps the embeddings on the device and copies them to the host once, at the end.

A batch is the chunk's rows cut to the batch's longest row: exactly the tensors the tokenizer gives for those rows
alone (padding to the longest row; tokenisation of a row never depends on the others), so only the batches'
composition differs from ``encode``, which moves float32 embeddings by rounding only (<= 1e-6 in the tests). Models
whose features cannot be cut that way (inputs flattened for flash-attention's variable-length kernels, query
expansion, padding past the longest row, no attention mask) are encoded by ``model.encode`` itself.

Example:
    >>> from cde_st import ContextualSentenceTransformer, encode_fast
    >>> model = ContextualSentenceTransformer("my-cde", device="cuda")            # doctest: +SKIP
    >>> model.set_context(corpus_texts)                                           # doctest: +SKIP
    >>> with torch.autocast("cuda", dtype=torch.bfloat16):                        # doctest: +SKIP
    ...     docs = encode_fast(model, corpus_texts, kind="document", batch_size=512, batch_tokens=65536)
    >>> docs.shape                                                                # doctest: +SKIP
    (5183, 384)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.util import truncate_embeddings
from sentence_transformers.util.quantization import quantize_embeddings
from tqdm.auto import tqdm

from cde_st.model import contextual_module, is_contextual
from cde_st.modules.batch_plan import longest_first_order, plan_batches
from cde_st.modules.forward_loop import forward_batches

__all__ = ["KINDS", "encode_fast"]

logger = logging.getLogger(__name__)

#: What ``kind=`` may be: the prompt and task of ``encode_query``, ``encode_document`` or plain ``encode``.
KINDS = ("query", "document", "text")
_DOCUMENT_PROMPT_NAMES = ("document", "passage", "corpus")  # encode_document's candidates, in its order


class _CannotCut(Exception):
    """The model's features cannot be cut into batches from a chunk: ``model.encode`` runs instead."""


def _resolve_prompt(model: SentenceTransformer, kind: str, prompt_name: str | None, prompt: str | None) -> str | None:
    """The prompt ``encode_query`` / ``encode_document`` / ``encode`` would use (same rules, same order)."""
    if prompt_name is None and prompt is None:
        if kind == "query" and "query" in model.prompts:
            prompt_name = "query"
        elif kind == "document":
            prompt_name = next((name for name in _DOCUMENT_PROMPT_NAMES if name in model.prompts), None)
    if prompt is not None:
        return prompt
    if prompt_name is not None:
        if prompt_name not in model.prompts:
            raise ValueError(
                f"Prompt name {prompt_name!r} not found in the model's prompts (keys {list(model.prompts)!r})."
            )
        return model.prompts[prompt_name]
    if model.default_prompt_name is not None:
        return model.prompts.get(model.default_prompt_name)
    return None


@dataclass
class _Chunk:
    """One chunk's batches, packed: ``flat`` (feature -> 1-D tensor holding every batch's (rows, L) block in turn),
    ``shapes`` ((rows, L) per batch), ``shared`` (the features every batch gets as they are, e.g. prompt_length) and
    ``positions`` (each packed row's index in the whole input, in packed order)."""

    flat: dict[str, torch.Tensor]
    shapes: list[tuple[int, int]]
    shared: dict[str, Any]
    positions: torch.Tensor

    def to(self, device: torch.device) -> _Chunk:
        non_blocking = device.type == "cuda"
        flat = {k: v.to(device, non_blocking=non_blocking) for k, v in self.flat.items()}
        return _Chunk(flat, self.shapes, self.shared, self.positions.to(device, non_blocking=non_blocking))

    def batches(self):
        """Each batch's input positions of its rows and its features (the packed tensors viewed as (rows, L))."""
        offset, row = 0, 0
        for rows, width in self.shapes:
            features = {k: v[offset : offset + rows * width].view(rows, width) for k, v in self.flat.items()}
            yield self.positions[row : row + rows], {**features, **self.shared}
            offset, row = offset + rows * width, row + rows


def _row_lengths(features: dict[str, Any], n: int) -> tuple[np.ndarray, bool]:
    """Tokens per row and whether padding is on the left, checked: every row's tokens contiguous at one end, and
    the widest tensor no wider than the longest row (padding to the longest row, nothing more)."""
    mask = features.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or mask.shape[0] != n:
        raise _CannotCut("the features have no (rows, length) attention_mask")
    lengths = mask.sum(dim=1)
    width = mask.shape[1]
    if n and int(lengths.max()) != width:
        raise _CannotCut(f"the features are padded past their longest row ({width} > {int(lengths.max())})")
    columns = torch.arange(width)
    right = bool((mask.bool() == (columns < lengths[:, None])).all())
    left = not right and bool((mask.bool() == (columns >= width - lengths[:, None])).all())
    if not (right or left):
        raise _CannotCut("the attention mask is not contiguous padding at one end of each row")
    return lengths.numpy(), left


def _pack_chunk(
    model: SentenceTransformer, texts: list, first: int, prompt: str | None, options: dict[str, Any]
) -> _Chunk:
    """Tokenise ``texts`` (input positions ``first``...) with the model's own ``preprocess`` in one call, sort them
    by token count, cut the batches and pack them (see :class:`_Chunk`)."""
    n = len(texts)
    features = model.preprocess(texts, prompt=prompt, **options["kwargs"])
    lengths, left = _row_lengths(features, n)
    tensors = {k: v for k, v in features.items() if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == n}
    if any(v.dim() != 2 for v in tensors.values()):
        raise _CannotCut(
            f"a per-row feature is not (rows, length): { {k: tuple(v.shape) for k, v in tensors.items()} }"
        )
    shared = {k: v for k, v in features.items() if k not in tensors}
    order = longest_first_order(lengths)
    spans = plan_batches(lengths[order], options["batch_size"], options["batch_tokens"])
    shapes = [(end - start, int(lengths[order[start]])) for start, end in spans]
    total = sum(rows * width for rows, width in shapes)
    index = torch.from_numpy(order)
    flat = {}
    for name, tensor in tensors.items():
        ordered = tensor[index]
        buffer = torch.empty(total, dtype=tensor.dtype, pin_memory=options["pin_memory"])
        offset = 0
        for (start, end), (rows, width) in zip(spans, shapes):
            block = ordered[start:end, tensor.shape[1] - width :] if left else ordered[start:end, :width]
            buffer[offset : offset + rows * width].view(rows, width).copy_(block)
            offset += rows * width
        flat[name] = buffer
    return _Chunk(flat, shapes, shared, index + first)


def _finished(embeddings: torch.Tensor, truncate_dim: int | None, normalize: bool) -> torch.Tensor:
    """``encode``'s truncation and normalisation of a batch's embeddings."""
    if truncate_dim is not None:
        embeddings = truncate_embeddings(embeddings, truncate_dim)
    if normalize:
        embeddings = torch.nn.functional.normalize(embeddings, p=2, dim=1)
    return embeddings


@torch.inference_mode()
def _embed_all(model: SentenceTransformer, texts: list, prompt: str | None, options: dict[str, Any]) -> torch.Tensor:
    """Every text's embedding, in input order, on the model's device: chunk k + 1 is tokenised and packed in a
    background thread while chunk k's batches run."""
    device, size = model.device, options["chunk_size"]
    starts = range(0, len(texts), size)
    result = None
    with (
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="cde_st-tokenize") as pool,
        tqdm(total=len(texts), unit="text", desc="encode_fast", disable=not options["show_progress_bar"]) as bar,
    ):
        pending = pool.submit(_pack_chunk, model, texts[:size], 0, prompt, options)
        for start in starts:
            chunk = pending.result().to(device)
            following = start + size
            if following < len(texts):
                pending = pool.submit(
                    _pack_chunk, model, texts[following : following + size], following, prompt, options
                )
            for positions, embeddings in forward_batches(model, chunk.batches(), **options["kwargs"]):
                embeddings = _finished(embeddings, options["truncate_dim"], options["normalize"])
                if result is None:
                    result = embeddings.new_empty((len(texts), *embeddings.shape[1:]))
                result.index_copy_(0, positions, embeddings)
                bar.update(len(positions))
    return result


def _as_output(
    embeddings: torch.Tensor | None, device, precision: str, convert_to_numpy: bool, convert_to_tensor: bool
):
    """``encode``'s conversions of the stacked embeddings (quantisation, then numpy / one tensor / a list)."""
    if embeddings is None:  # no input: what encode returns for an empty list
        embeddings = torch.tensor([], device=device)
        if convert_to_tensor:
            return embeddings
        return np.array([]) if convert_to_numpy else []
    if precision and precision != "float32":
        embeddings = quantize_embeddings(embeddings, precision=precision)
    if convert_to_tensor:
        return torch.as_tensor(embeddings)
    if convert_to_numpy:
        if isinstance(embeddings, torch.Tensor):
            embeddings = (embeddings.float() if embeddings.dtype == torch.bfloat16 else embeddings).cpu().numpy()
        return embeddings
    return list(torch.from_numpy(embeddings) if isinstance(embeddings, np.ndarray) else embeddings)


def _can_cut(model: SentenceTransformer, kind: str) -> str | None:
    """Why the model's features cannot be cut from a chunk, known before tokenising (None: they may be)."""
    first = model[0] if len(model) else None
    if getattr(first, "can_flatten_inputs", False):
        return "its inputs are flattened (flash-attention variable-length kernels)"
    if kind == "query" and getattr(first, "query_expansion", None) is not None:
        return "it expands queries to a fixed width"
    return None


_FALL_BACK = object()  # _embed_or_none's answer when model.encode must run instead


def _embed_or_none(model: SentenceTransformer, kind: str, texts: list, prompt: str | None, options: dict):
    """The embeddings (None for no texts), or ``_FALL_BACK`` (logged) when the features cannot be cut."""
    reason = _can_cut(model, kind)
    if reason is None:
        one_check = contextual_module(model).one_weights_check() if is_contextual(model) else contextlib.nullcontext()
        try:
            with one_check:
                model.eval()  # as encode(): inference mode of dropout; a contextual model compares its weights once
                return _embed_all(model, texts, prompt, options) if texts else None
        except _CannotCut as why:
            reason = str(why)
    logger.info("encode_fast: %s, so model.encode runs instead.", reason)
    return _FALL_BACK


def _check_arguments(model, kind, batch_size, batch_tokens, chunk_size, precision, kwargs) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}.")
    plan_batches([], batch_size, batch_tokens)  # checks both
    if precision is not None and precision not in ("float32", "int8", "uint8", "binary", "ubinary"):
        raise ValueError(f"Precision {precision!r} is not supported.")
    if "task" in kwargs:
        raise TypeError("encode_fast() sets the task from kind=; do not pass task=.")
    unknown = set(kwargs) - set(model.get_model_kwargs()) - {"processing_kwargs"}
    if unknown:
        raise ValueError(
            f"encode_fast() got keyword arguments this model does not use: {sorted(unknown)}; "
            f"it reads {sorted(model.get_model_kwargs())}."
        )


def encode_fast(
    model: SentenceTransformer,
    inputs: str | Sequence[str],
    kind: Literal["query", "document", "text"] = "document",
    *,
    prompt_name: str | None = None,
    prompt: str | None = None,
    batch_size: int = 32,
    batch_tokens: int | None = None,
    chunk_size: int = 4096,
    pin_memory: bool | None = None,
    show_progress_bar: bool | None = None,
    precision: Literal["float32", "int8", "uint8", "binary", "ubinary"] = "float32",
    convert_to_numpy: bool = True,
    convert_to_tensor: bool = False,
    normalize_embeddings: bool = False,
    truncate_dim: int | None = None,
    **kwargs: Any,
) -> np.ndarray | torch.Tensor | list[torch.Tensor]:
    """``model.encode_document(inputs)`` (``kind="document"``), ``model.encode_query(inputs)`` (``"query"``) or
    ``model.encode(inputs)`` (``"text"``), with the same arguments and the same embeddings, tokenised ahead and cut
    into batches by token count (see the module docstring for how and why).

    Args:
        model: a sentence-transformers model (a ``ContextualSentenceTransformer`` too: its context, given as
            ``context_vectors=`` / ``dataset_embeddings=`` or the active one, is read as by ``encode``, with the
            weights compared with the context's once per call). It runs on its own device; autocast, if wanted,
            is the caller's (``with torch.autocast("cuda", dtype=torch.bfloat16): ...``).
        inputs: one text or a sequence of texts. Output rows are in input order; repeats are encoded each time.
        kind: which of the three methods this call stands for (its prompt and ``task``).
        prompt_name, prompt: as in ``encode`` (None: the kind's prompt, as ``encode_query`` / ``encode_document``).
        batch_size: at most this many rows a batch.
        batch_tokens: at most this many padded tokens (rows x longest row) a batch; None: rows only. Rows are sorted
            by token count, so a budget lets short texts (queries) go in larger batches than long ones.
        chunk_size: texts tokenised (in one call of the model's ``preprocess``) and length-sorted together; the
            next chunk is tokenised in a background thread while the device runs this one's batches.
        pin_memory: pin the packed tokens so the host-to-device copy does not block (None: on CUDA).
        show_progress_bar, precision, convert_to_numpy, convert_to_tensor, normalize_embeddings, truncate_dim,
            kwargs: as in ``encode`` (kwargs: the model's forward keywords, e.g. ``context_vectors``).

    Returns:
        What the corresponding ``encode`` method returns for these arguments: a (n, d) numpy array by default, one
        tensor on the model's device with ``convert_to_tensor=True``, a list of row tensors with neither; one row for
        a single text; an empty array / tensor / list for no texts.

    Models whose features cannot be cut (module docstring) are encoded by ``model.encode``. Not offered: pools,
    ``output_value`` other than sentence embeddings, ``device=`` (move the model with ``model.to(device)``).
    """
    _check_arguments(model, kind, batch_size, batch_tokens, chunk_size, precision, kwargs)
    single = isinstance(inputs, str)
    texts = [inputs] if single else (inputs.tolist() if isinstance(inputs, np.ndarray) else list(inputs))
    prompt = _resolve_prompt(model, kind, prompt_name, prompt)
    call_kwargs = dict(kwargs) if kind == "text" else {**kwargs, "task": kind}
    encode_options = _encode_options(
        model, show_progress_bar, precision, convert_to_numpy, convert_to_tensor, normalize_embeddings, truncate_dim
    )
    options = _fast_options(model, call_kwargs, encode_options, batch_size, batch_tokens, chunk_size, pin_memory)
    embeddings = _embed_or_none(model, kind, texts, prompt, options)
    if embeddings is _FALL_BACK:
        return model.encode(inputs, prompt=prompt, batch_size=batch_size, **encode_options, **call_kwargs)
    convert_to_numpy = encode_options["convert_to_numpy"]
    output = _as_output(embeddings, model.device, precision, convert_to_numpy, convert_to_tensor)
    return output[0] if single else output


def _encode_options(
    model: SentenceTransformer,
    show_progress_bar: bool | None,
    precision: str,
    convert_to_numpy: bool,
    convert_to_tensor: bool,
    normalize_embeddings: bool,
    truncate_dim: int | None,
) -> dict[str, Any]:
    """``encode``'s own options of this call, with its defaults resolved as ``encode`` resolves them: a progress bar
    at INFO or DEBUG logging, the model's ``truncate_dim``, numpy only without ``convert_to_tensor``."""
    if show_progress_bar is None:
        show_progress_bar = logger.getEffectiveLevel() in (logging.INFO, logging.DEBUG)
    return dict(
        show_progress_bar=show_progress_bar,
        precision=precision,
        convert_to_numpy=convert_to_numpy and not convert_to_tensor,
        convert_to_tensor=convert_to_tensor,
        normalize_embeddings=normalize_embeddings,
        truncate_dim=model.truncate_dim if truncate_dim is None else truncate_dim,
    )


def _fast_options(
    model: SentenceTransformer,
    call_kwargs: dict[str, Any],
    encode_options: dict[str, Any],
    batch_size: int,
    batch_tokens: int | None,
    chunk_size: int,
    pin_memory: bool | None,
) -> dict[str, Any]:
    """What the fast path reads: the forward's keywords (``call_kwargs``), how to cut and pack the batches, and the
    finishing of ``encode_options`` (progress bar, truncation, normalisation)."""
    return dict(
        kwargs=call_kwargs,
        batch_size=batch_size,
        batch_tokens=batch_tokens,
        chunk_size=max(chunk_size, batch_size),
        pin_memory=model.device.type == "cuda" if pin_memory is None else pin_memory,
        show_progress_bar=encode_options["show_progress_bar"],
        truncate_dim=encode_options["truncate_dim"],
        normalize=encode_options["normalize_embeddings"],
    )
