"""The serving tests' models and servers: a tiny random contextual model (with a saved context) and a tiny plain
sentence-transformers model, saved once per session, and real ``cde-st-serve`` processes on 127.0.0.1 with a port
the OS picks."""

from __future__ import annotations

import signal

import pytest
from serving_helpers import API_KEY_ENV, CONTEXT_SIZE, MAX_SEQ_LENGTH, Server


@pytest.fixture(scope="session")
def cde_dir(tiny_bert_dir, tmp_path_factory) -> str:
    """A tiny contextual model folder: cached attention without a gate and an MLP head, so the context visibly
    changes every embedding; it ends with Normalize and is saved with a context (served as "default")."""
    import torch
    from sample_texts import SHORT_DOCS

    from cde_st import ContextualSentenceTransformer

    torch.manual_seed(0)
    model = ContextualSentenceTransformer.from_encoder(
        tiny_bert_dir,
        context_size=CONTEXT_SIZE,
        max_seq_length=MAX_SEQ_LENGTH,
        output_head="mlp",
        first_stage_residual=False,
        context_gate=False,
        normalize=True,
    )
    model.set_context(SHORT_DOCS, seed=0)
    path = tmp_path_factory.mktemp("serving") / "tiny-cde"
    model.save(str(path))
    return str(path)


@pytest.fixture(scope="session")
def plain_dir(tiny_bert_dir, tmp_path_factory) -> str:
    """A tiny plain sentence-transformers model (mean pooling, no Normalize)."""
    from sentence_transformers import SentenceTransformer

    path = tmp_path_factory.mktemp("serving") / "tiny-plain"
    SentenceTransformer(tiny_bert_dir).save(str(path))
    return str(path)


@pytest.fixture(scope="session")
def cde_model(cde_dir):
    """The contextual model loaded in the test process: what the server's answers are compared with."""
    from cde_st import ContextualSentenceTransformer

    model = ContextualSentenceTransformer(cde_dir)
    model.eval()
    return model


@pytest.fixture
def start_server(tmp_path):
    """Factory: start a server (``start_server(model, *flags, env=...)``); every server is stopped at the end."""
    servers: list[Server] = []

    def start(model: str, *args: str, env: dict | None = None, fresh: bool = False, started=None) -> Server:
        server = Server(model, tmp_path / f"server-{len(servers)}.log", *args, env=env, fresh=fresh, started=started)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def cde_server(cde_dir, tmp_path_factory):
    """A contextual server shared by a test module: API key required, small limits so the limits are testable,
    over-long inputs truncated unless a request says otherwise."""
    folder = tmp_path_factory.mktemp("cde_server")
    server = Server(
        cde_dir,
        folder / "server.log",
        "--state-dir", str(folder / "state"),
        "--served-model-name", "tiny-cde",
        "--api-key-env", API_KEY_ENV,
        "--max-inputs", "64",
        "--max-body-mb", "0.25",
        "--truncate",  # the tiny tokenizer spells unknown words letter by letter: most test texts exceed 32 tokens
    )  # fmt: skip
    yield server
    server.stop()
