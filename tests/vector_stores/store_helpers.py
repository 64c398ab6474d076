"""Shared data of the vector-store tests: a small corpus, its writer, and cde-st-embed from Python."""

from __future__ import annotations

import json

DOCS = [
    {"_id": f"d{i}", "title": f"topic {i % 4}", "text": f"note {i} about {('rain', 'lava', 'bread', 'orbits')[i % 4]}"}
    for i in range(30)
]


def write_corpus(path, docs) -> str:
    """Write ``docs`` as a JSON-lines corpus at ``path``."""
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return str(path)


def embed(model, corpus: str, out, **kwargs) -> str:
    """``cde-st-embed`` from Python: the folder ``out`` (shards of 8, no progress bar), its flat index built."""
    from cde_st.corpus import embed_corpus
    from cde_st.corpus.index import build_index

    embed_corpus(model, corpus, out, shard_size=8, show_progress_bar=False, **kwargs)
    build_index(out, show_progress_bar=False)
    return str(out)
