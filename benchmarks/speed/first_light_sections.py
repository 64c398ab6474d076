"""The sections of ``gpu_first_light.py``, run in its worker process: each measures its rows through a
:class:`Section`, which skips a row that would not fit in what is left of the section's time budget and records a
failing row (out of memory, an error) as a result. What each section measures: ``gpu_first_light.py``'s docstring.
"""

from __future__ import annotations

import statistics
import time
import warnings

from harness import emit_result, free_memory, sync, timed_calls, warm_up
from random_models import autocast_bf16, bi_encoder, make_texts, mini_contextual, v2_architecture
from train_step import measure_step

__all__ = ["SECTION_FUNCS", "Section", "torch_spherical_kmeans"]


class Section:
    """A section's rows and its soft time budget: ``fits`` says whether a row expected to take ``seconds`` still
    fits before the deadline (a row that does not is recorded as skipped, with the reason)."""

    def __init__(self, name: str, deadline: float) -> None:
        self.name, self.deadline, self.longest = name, deadline, 0.0

    def emit(self, row: dict) -> None:
        emit_result({"section": self.name, "row": row})

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
        free_memory()


def section_agreement(sec: Section, ctx: dict) -> None:
    import torch

    sizes, device = ctx["sizes"], ctx["device"]
    docs = make_texts(ctx["tokenizer"], sizes["agreement_docs"], sizes["doc_words"] // 2, seed=1)
    queries = make_texts(ctx["tokenizer"], sizes["agreement_queries"], sizes["query_words"], seed=2)
    context = make_texts(ctx["tokenizer"], sizes["agreement_context"], sizes["doc_words"] // 2, seed=3)

    def encode(model, where: str, bf16: bool = False) -> torch.Tensor:
        model.to(where)
        with torch.inference_mode(), autocast_bf16(where, bf16):
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
    """Texts per second of one encode call over ``texts`` (bf16 autocast), after a warm-up batch."""
    import torch

    encode = model.encode_query if role == "query" else model.encode_document
    with torch.inference_mode(), autocast_bf16(device, True):
        warm_up(lambda: encode(texts[:batch], batch_size=batch), device=device)  # kernels, allocator
        (seconds,), _ = timed_calls(lambda: encode(texts, batch_size=batch), device=device)
    return len(texts) / seconds


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
                    with torch.inference_mode(), autocast_bf16(device, True):
                        (holder["set_context_s"],), _ = timed_calls(
                            lambda: holder["model"].set_context(context, seed=0), device=device
                        )
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
        free_memory()


def section_step(sec: Section, ctx: dict) -> None:
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
            with autocast_bf16(device, True):
                out = module(dict(features), context_vectors=vectors)["sentence_embedding"]
            out.float().pow(2).sum().backward()

        return run

    for name, build, what in paths():

        def measure(build=build, what=what) -> dict:
            model = build().to(device)
            if what == "encode" and hasattr(model, "set_context"):
                with torch.inference_mode(), autocast_bf16(device, True):
                    model.set_context(context, seed=0)

            def run():
                with torch.inference_mode(), autocast_bf16(device, True):
                    if what == "set_context":
                        model.set_context(context, seed=0)
                    else:
                        model.encode_document(docs, batch_size=len(docs))
                sync(device)

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
            (seconds,), clustering = timed_calls(lambda: cluster_pairs(q, d, cluster_size=cluster, seed=0))
            gpu = hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0
            return {"k": clustering.num_clusters, "kmeans_s": seconds, "where": "GPU" if gpu else "CPU"}

        sec.run({"implementation": f"faiss {faiss.__version__} (cluster_pairs)", "pairs": n, "dim": dim}, with_faiss)

    def with_torch() -> dict:
        import torch

        generator = torch.Generator().manual_seed(0)
        q = torch.nn.functional.normalize(torch.randn(n, dim, generator=generator), dim=1).to(device)
        d = torch.nn.functional.normalize(torch.randn(n, dim, generator=generator), dim=1).to(device)
        sync(device)
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
        sync(device)
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

        def tokenize_all() -> None:
            for texts in (queries, documents):
                for i in range(0, n, batch):
                    model.tokenize(texts[i : i + batch])

        (seconds,), _ = timed_calls(tokenize_all)
        return {"pairs_per_s": n / seconds}

    def embed(dtype, tf32: bool = False) -> dict:
        model = bi_encoder(ctx["bert_folder"], 64).to(device)
        if dtype is not None:
            model = model.to(dtype)
        previous = torch.get_float32_matmul_precision()
        if tf32:
            torch.set_float32_matmul_precision("high")
        try:
            # length 64: the model's
            warm_up(lambda: embed_pairs(model, queries[:batch], documents[:batch], batch_size=batch), device=device)
            (seconds,), (q, d) = timed_calls(
                lambda: embed_pairs(model, queries, documents, batch_size=batch), device=device
            )
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
