"""The served model (loaded by name as every command loads one: :func:`cde_st.model_loading.load_model`) and the two
things the server asks of it (embed a batch of texts with a context, embed a new context). Every forward runs in
:attr:`Engine.executor`, one worker thread, so forwards never block the event loop and never run two at a time (a
second forward would only split the same cores); with ``model_process`` that thread hands embedding forwards to a
child process (:mod:`cde_st.serving.model_process`). A new context's first stage runs there one batch at a time
(:meth:`Engine.create_context`), so embedding batches queued meanwhile run between its batches instead of waiting
for the whole context.

The forwards themselves, the contexts' switching and their keys/values kept under a byte budget, are
:class:`~cde_st.serving.forwards.Forwards`: what the engine runs here, and all a model process builds. The engine
adds what only the server's process needs: the request tokenizers and their thread, the model's thread, the
contexts' creation and the forward-cost probes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Normalize

from cde_st.context import ContextInfo
from cde_st.context_errors import ContextTooLarge
from cde_st.fingerprints import model_fingerprint
from cde_st.model import is_contextual
from cde_st.model_loading import load_model
from cde_st.modules.first_stage_batches import in_input_order
from cde_st.serving import defaults
from cde_st.serving.context_cache import CacheStats
from cde_st.serving.contexts import DEFAULT_NAME, StoredContext
from cde_st.serving.forwards import Batch, Forwards
from cde_st.serving.model_process import ModelProcess
from cde_st.serving.tokens import RequestTokenizer, Tokens

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: After each first-stage batch of a creation, queued embeddings may use up to this many times its duration first.
CREATION_YIELD = 2.0
#: Embeddings count as under way for this many seconds after a forward (the gap before a client's next request).
EMBEDDING_GAP = 0.05
#: Probe forwards of :meth:`Engine.measure_forward_overhead`: 1 and this many texts of this many words.
FORWARD_PROBE_TEXTS, FORWARD_PROBE_WORDS = 8, 24


def _served_model(
    model: str | SentenceTransformer, device: str | None, dtype: str | None, backend: str, onnx_file: str | None
) -> tuple[SentenceTransformer, str]:
    """The model to serve (loaded if given by location), in eval mode and cast to ``dtype``, and its identity."""
    if backend != "torch" and dtype not in (None, "float32"):
        raise ValueError(f"--dtype {dtype} applies to the torch backend; the ONNX graphs run in float32.")
    if isinstance(model, str):
        model = load_model(model, device=device, backend=backend, onnx_file=onnx_file)
    model.eval()
    # The identity is read before a dtype cast, so a context made in float32 is served in bfloat16 too.
    identity = model_fingerprint(model)
    if dtype is not None and dtype != "float32":
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}.")
        model.to(DTYPES[dtype])
    return model, identity


class Engine:
    """One model and its worker thread. ``model`` may be given already built (tests, benchmarks) instead of a
    location. ``context_cache_bytes``: the budget for the keys/values of the contexts kept between switches.
    Call :meth:`close` when done."""

    def __init__(
        self,
        model: str | SentenceTransformer,
        *,
        device: str | None = None,
        dtype: str | None = defaults.DTYPE,
        backend: str = defaults.BACKEND,
        onnx_file: str | None = None,
        served_name: str | None = None,
        max_batch_size: int = defaults.MAX_BATCH_SIZE,
        max_batch_tokens: int | None = defaults.MAX_BATCH_TOKENS,
        context_cache_bytes: int = defaults.CONTEXT_CACHE_BYTES,
        context_batch_size: int = defaults.CONTEXT_BATCH_SIZE,
        model_process: bool = defaults.MODEL_PROCESS,
    ) -> None:
        location = model if isinstance(model, str) else None
        self.model, self.identity = _served_model(model, device, dtype, backend, onnx_file)
        self.contextual = is_contextual(self.model)
        self.served_name = served_name or (_default_name(location) if location else "cde-st-model")
        self.dimension = int(self.model.get_embedding_dimension())
        self.normalizes = any(isinstance(module, Normalize) for module in self.model)
        self.max_seq_length = int(self.model.max_seq_length)
        self.max_batch_size, self.max_batch_tokens = max_batch_size, max_batch_tokens
        self._process_forwards = 0  # forward passes the model process reported
        # Requests are tokenised in their own thread, so the model's thread only pads and runs forwards.
        prompts = [self.prompt_for(input_type) for input_type in (None, "query", "document")]
        self.request_tokenizer = RequestTokenizer(self.model, self.max_seq_length, prompts)
        # A second copy for short requests, tokenised where they arrive (the event loop): a thread hop per query
        # costs more than its tokenising, and two threads never share one fast tokenizer.
        self.inline_tokenizer = RequestTokenizer(self.model, self.max_seq_length, prompts)
        self.tokenizer_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cde-st-tokenize")
        # Smaller than set_context's 32 (an embedding then waits less behind one); the vectors differ from
        # set_context's by rounding only (other padding), the sample and the fingerprint not at all.
        self.context_batch_size = context_batch_size
        self.last_forward = float("-inf")  # when the last embedding forward ended (perf_counter)
        self.created = int(time.time())
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cde-st-model")
        self._model_context = self._saved_context()
        #: Where embedding forwards run when ``model_process`` is set: a child process with its own interpreter
        #: (:mod:`cde_st.serving.model_process`); creations and the forward-cost probes' tokenising stay here.
        self.model_process: ModelProcess | None = None
        if model_process:
            if self.model.device.type != "cpu":
                raise ValueError(
                    f"A model process serves CPU models only; this model is on {self.model.device}. Leave out the "
                    "model process option (--model-process) for it."
                )
            settings = dict(max_batch_size=max_batch_size, max_batch_tokens=max_batch_tokens,
                            context_cache_bytes=context_cache_bytes)  # fmt: skip
            self.model_process = ModelProcess(self.model, settings)
            self.model_process.start()
        #: The forwards run here (all of them without a model process); with one, its weights-check scope covers
        #: the first stage of context creations, which stay in this process.
        self.local = Forwards(self.model, max_batch_size=max_batch_size, max_batch_tokens=max_batch_tokens,
                              context_cache_bytes=context_cache_bytes)  # fmt: skip

    def close(self) -> None:
        """Stop the worker threads and the model's process, and end the engine's weights-check scope."""
        self.tokenizer_executor.shutdown(wait=True)
        self.executor.shutdown(wait=True)
        if self.model_process is not None:
            self.model_process.close()
        self.local.close()

    # ------------------------------------------------------------------ contexts
    @property
    def context_size(self) -> int | None:
        """J, the model's context slots (None for a plain model)."""
        return self.model.contextual_module.context_size if self.contextual else None

    def _saved_context(self) -> StoredContext | None:
        if not self.contextual or self.model.context_info is None:
            return None
        info, module = self.model.context_info, self.model.contextual_module
        return StoredContext(
            name=DEFAULT_NAME,
            fingerprint=info.fingerprint,
            size=info.size,
            seed=info.seed,
            vectors=module.context_vectors.detach().float().cpu(),
            model_identity=self.identity,
            corpus_size=info.corpus_size,
            origin="model",
        )

    @property
    def model_context(self) -> StoredContext | None:
        """The context saved in the model folder, served as ``"default"``."""
        return self._model_context

    def make_context(self, name: str, documents: list[str], size: int | None, seed: int) -> StoredContext:
        """Sample ``size`` (default J) documents with ``seed``, prompt them and run the first stage: what
        ``model.set_context(documents, seed=seed)`` does in-process (the library's sample, vectors, fingerprint and
        corpus count), for any size up to J (fewer rows leave the remaining slots to the null context). Runs in the
        calling thread; the server uses :meth:`create_context`."""
        sampled, info = self._sample(documents, size, seed)
        batches = list(self.model.contextual_module.context_batches(sampled, self.context_batch_size))
        return self._stored(name, info, batches)

    async def create_context(
        self, name: str, documents: list[str], size: int | None, seed: int, waiting: Callable[[], int] = lambda: 0
    ) -> StoredContext:
        """:meth:`make_context` for the server: the sampling off the event loop, then the first stage in the
        worker one batch at a time. Embeddings go first: after a batch that took t seconds, the next waits while
        embeddings are under way (``waiting()``, the count of embedding texts queued, is not 0, or a forward ended
        less than ``EMBEDDING_GAP`` s ago: clients send their next request right after an answer), for at most
        ``CREATION_YIELD`` x t; so under load a creation takes about a third of the worker's time and an embedding
        waits at most one such batch, and without load it runs at full speed."""
        sampled, info = await asyncio.to_thread(self._sample, documents, size, seed)
        loop = asyncio.get_running_loop()
        batches = self.model.contextual_module.context_batches(sampled, self.context_batch_size)
        done = []
        while True:
            started = time.perf_counter()
            batch = await loop.run_in_executor(self.executor, next, batches, None)
            if batch is None:
                return self._stored(name, info, done)
            done.append(batch)
            deadline = time.perf_counter() + CREATION_YIELD * (time.perf_counter() - started)
            while time.perf_counter() < deadline and (
                waiting() or time.perf_counter() - self.last_forward < EMBEDDING_GAP
            ):
                await asyncio.sleep(0.002)

    def _sample(self, documents: list[str], size: int | None, seed: int) -> tuple[list[str], ContextInfo]:
        module = self.model.contextual_module
        if size is not None and size > module.context_size:
            raise ContextTooLarge(f"size {size} exceeds the model's {module.context_size} context slots (J).", "size")
        return module.sample_corpus(documents, seed, size=size)

    def _stored(self, name: str, info: ContextInfo, batches: list) -> StoredContext:
        """The context of the first stage's ``batches`` (positions, vectors), back in sample order."""
        module = self.model.contextual_module
        vectors = in_input_order(batches, module.hidden_size, torch.device("cpu"))
        return StoredContext(
            name=name,
            fingerprint=info.fingerprint,
            size=info.size,
            seed=info.seed,
            vectors=vectors.detach().float().cpu().contiguous(),
            model_identity=self.identity,
            corpus_size=info.corpus_size,
        )

    def cache_stats(self) -> CacheStats:
        """The contexts whose keys/values are kept, their bytes, and the evictions so far (with a model process:
        as of its last forward)."""
        return self.local.cache_stats() if self.model_process is None else self.model_process.cache

    # ------------------------------------------------------------------ embedding
    def prompt_for(self, input_type: str | None) -> str:
        """The prompt text a request gets: the model's ``query`` / ``document`` prompt (none if it has no such
        prompt), or, without ``input_type``, what ``encode()`` applies (the default prompt: a cde_st model's
        document prompt)."""
        prompts = self.model.prompts or {}
        if input_type is None:
            default = self.model.default_prompt_name
            return prompts.get(default, "") if default else ""
        return prompts.get(input_type, "")

    def tokenize(self, texts: list[str], input_type: str | None) -> Tokens:
        """One request's texts cut, counted and tokenised with the prompt of ``input_type``; run it in
        :attr:`tokenizer_executor`, off the model's thread."""
        return self.request_tokenizer.tokenize(texts, self.prompt_for(input_type))

    def tokenize_inline(self, texts: list[str], input_type: str | None) -> Tokens:
        """:meth:`tokenize` for a short request, in the event loop's thread (its own tokenizer copy)."""
        return self.inline_tokenizer.tokenize(texts, self.prompt_for(input_type))

    def embed(self, texts: list[str], input_type: str | None, context: StoredContext | None) -> Batch:
        """:meth:`embed_tokens` of ``texts`` tokenised in the calling thread (scripts and tests)."""
        return self.embed_tokens([self.tokenize(texts, input_type)], context)

    def embed_tokens(self, parts: list[Tokens], context: StoredContext | None) -> Batch:
        """The forwards of a batch of tokenised requests (``parts``, all with one prompt), chunked at
        ``max_batch_size`` texts and ``max_batch_tokens`` tokens, with ``context`` (None: the null context of a
        contextual model, nothing for a plain one); one row per text, requests in order. With a model process the
        forwards run there, and :class:`~cde_st.serving.model_process.ModelProcessFailed` says it died."""
        if self.model_process is not None:
            batch, forwards = self.model_process.embed(parts, context, self.forward_overhead_tokens)
            self._process_forwards += forwards
        else:
            batch = self.local.embed_tokens(parts, context)
        self.last_forward = time.perf_counter()
        return batch

    @property
    def forwards(self) -> int:
        """Forward passes run (a batch may be cut into several), here or in the model process."""
        return self.local.forwards + self._process_forwards

    @property
    def forward_overhead_tokens(self) -> float | None:
        """What one more forward costs, in padded tokens (:meth:`measure_forward_overhead`); None: forwards are
        cut as full as the limits allow."""
        return self.local.forward_overhead_tokens

    @forward_overhead_tokens.setter
    def forward_overhead_tokens(self, tokens: float | None) -> None:
        self.local.forward_overhead_tokens = tokens

    def forward_probes(self) -> tuple[Tokens, Tokens] | None:
        """The probe texts of :meth:`measure_forward_overhead`, tokenised (run it where requests are tokenised):
        one text, and as many of it as one forward may hold up to ``FORWARD_PROBE_TEXTS``; None where the limits
        allow no forward of two."""
        text = "word " * max(1, min(FORWARD_PROBE_WORDS, self.max_seq_length // 2))
        one = self.tokenize([text], "document")
        count = min(FORWARD_PROBE_TEXTS, self.max_batch_size)
        if self.max_batch_tokens is not None:
            count = min(count, self.max_batch_tokens // one.longest)
        return (one, self.tokenize([text] * count, "document")) if count >= 2 else None

    def measure_forward_overhead(
        self, probes: tuple[Tokens, Tokens] | None, context: StoredContext | None, repeats: int = 3
    ) -> float | None:
        """Time the forwards of ``probes`` (:meth:`forward_probes`; fastest of ``repeats``) with ``context`` and set
        :attr:`forward_overhead_tokens`: what a forward costs beyond its tokens, in tokens. A batch is then cut
        into forwards where padding would cost more than another forward (on a CPU a forward reads every weight,
        tens of tokens' worth; on a GPU thousands, and batches stay whole). Without probes nothing is set. Runs
        in the calling thread (the server: in :attr:`executor`, once warm)."""
        self.forward_overhead_tokens = None  # the probe forwards are not cut
        if probes is None:
            return None

        def fastest(tokens: Tokens) -> float:
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                self.embed_tokens([tokens], context)
                times.append(time.perf_counter() - started)
            return min(times)

        one, many = probes
        single, several = fastest(one), fastest(many)
        per_token = max(several - single, 1e-9) / ((len(many) - 1) * one.longest)
        self.forward_overhead_tokens = max(1.0, single / per_token - one.longest)
        return self.forward_overhead_tokens


def _default_name(location: str) -> str:
    """The model name a server answers to by default: a hub id as given, a folder by its last part."""
    path = Path(os.path.expanduser(location))
    return path.name if path.exists() else location
