"""GPU options on a machine without a GPU: faiss k-means picks the GPU only when a GPU build sees a device, and
asking for faiss on GPU or for flash-attention without what they need is a clear error naming the missing piece.
The GPU builds and devices are simulated by monkeypatching; nothing here needs CUDA."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

import faiss
import numpy as np
import pytest
import torch

from cde_st.batching.clustering import cluster_pairs, faiss_use_gpu
from cde_st.modules.encoders import resolve_attn_implementation


def _pairs(n: int = 60, dim: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, dim)).astype(np.float32), rng.normal(size=(n, dim)).astype(np.float32)


@pytest.fixture
def cpu_faiss(monkeypatch):
    """faiss as the faiss-cpu wheel is: no GPU resources class."""
    monkeypatch.delattr(faiss, "StandardGpuResources", raising=False)


@pytest.fixture
def gpu_faiss(monkeypatch):
    """A GPU build of faiss; returns a setter for the number of devices it sees."""
    monkeypatch.setattr(faiss, "StandardGpuResources", object, raising=False)

    def devices(n: int) -> None:
        monkeypatch.setattr(faiss, "get_num_gpus", lambda: n)

    return devices


@pytest.fixture
def kmeans_calls(monkeypatch):
    """Records the ``gpu`` argument every faiss.Kmeans gets, and trains on the CPU whatever it asked for."""
    real, calls = faiss.Kmeans, []

    def kmeans(d, k, **kwargs):
        calls.append(kwargs.get("gpu"))
        return real(d, k, **{**kwargs, "gpu": False})

    monkeypatch.setattr(faiss, "Kmeans", kmeans)
    return calls


def test_cpu_build_clusters_on_cpu_by_default(cpu_faiss, kmeans_calls):
    assert faiss_use_gpu(None) is False
    clustering = cluster_pairs(*_pairs(), cluster_size=20, seed=0)
    assert kmeans_calls == [False]
    assert clustering.num_clusters == 3


def test_gpu_build_with_a_device_is_used_automatically(gpu_faiss, kmeans_calls):
    gpu_faiss(1)
    assert faiss_use_gpu(None) is True
    cluster_pairs(*_pairs(), cluster_size=20, seed=0)  # use_gpu=None: the default of the sampler too
    cluster_pairs(*_pairs(), cluster_size=20, seed=0, use_gpu=False)
    assert kmeans_calls == [True, False]


def test_gpu_build_without_a_device_stays_on_cpu(gpu_faiss, kmeans_calls):
    gpu_faiss(0)
    cluster_pairs(*_pairs(), cluster_size=20, seed=0)
    assert kmeans_calls == [False]


def test_explicit_gpu_with_cpu_build_names_the_gpu_wheel(cpu_faiss):
    with pytest.raises(ValueError, match=r"CPU-only build \(faiss-cpu\).*pip uninstall faiss-cpu.*cde_st\[faiss-gpu\]"):
        cluster_pairs(*_pairs(), cluster_size=20, use_gpu=True)


def test_explicit_gpu_without_a_device_names_the_device(gpu_faiss):
    gpu_faiss(0)
    with pytest.raises(ValueError, match=r"GPU build\) sees no CUDA device"):
        cluster_pairs(*_pairs(), cluster_size=20, use_gpu=True)


# ---------------------------------------------------------------- flash-attention
@pytest.fixture
def flash_attn(monkeypatch):
    """Pretend the flash-attn package is installed (True) or not (False)."""
    real = importlib.util.find_spec

    def install(present: bool) -> None:
        spec = importlib.machinery.ModuleSpec("flash_attn", None) if present else None
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda name, *a, **k: spec if name == "flash_attn" else real(name, *a, **k)
        )

    return install


def test_auto_never_picks_flash_attention_it_cannot_run(flash_attn, monkeypatch):
    flash_attn(False)
    monkeypatch.setattr(torch, "get_default_dtype", lambda: torch.bfloat16)
    assert resolve_attn_implementation("auto") == "sdpa"


def test_flash_without_the_package_names_it(flash_attn, monkeypatch, tiny_bert_dir):
    from cde_st import ContextualSentenceTransformer

    flash_attn(False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ImportError, match=r"needs the flash-attn package \(pip install 'cde_st\[flash\]'") as info:
        ContextualSentenceTransformer.from_encoder(
            tiny_bert_dir, context_size=4, attn_implementation="flash_attention_2"
        )
    assert "CUDA device" not in str(info.value)
    # Raised by cde_st before any encoder is built, not from deep inside transformers.
    assert not any("transformers" in Path(str(entry.path)).parts for entry in info.traceback)


def test_flash_without_cuda_names_the_device(flash_attn):
    flash_attn(True)
    with pytest.raises(ImportError, match=r"needs a CUDA device \(torch.cuda.is_available\(\) is False") as info:
        resolve_attn_implementation("flash_attention_2")
    assert "flash-attn package" not in str(info.value)


def test_flash_when_loading_names_what_is_missing(flash_attn, make_tiny_cde, tmp_path):
    from cde_st import ContextualSentenceTransformer

    make_tiny_cde().save(str(tmp_path / "cde"))
    flash_attn(False)
    with pytest.raises(ImportError, match=r"flash-attn package .* and a CUDA device"):
        ContextualSentenceTransformer(str(tmp_path / "cde"), model_kwargs={"attn_implementation": "flash_attention_2"})


def test_flash_attention_with_text_scoped_sliding_windows_is_refused():
    """flash-attention ignores masks: ModernBERT's sliding-window layers would drop the whole-prefix rule."""
    from transformers import ModernBertConfig

    from cde_st.modules.contextual_config import check_flash_attention

    config = ModernBertConfig(num_hidden_layers=3, global_attn_every_n_layers=3)
    assert "sliding_attention" in config.layer_types
    config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="local_attention_scope"):
        check_flash_attention(config, "text", split_attention=False)
    check_flash_attention(config, "sequence", split_attention=False)  # the released rule: what flash does
    config._attn_implementation = "sdpa"
    check_flash_attention(config, "text", split_attention=False)
