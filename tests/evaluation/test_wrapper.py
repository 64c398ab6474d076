"""The mteb encoder wrapper: prompts per role, and the context it puts on the model."""

from __future__ import annotations

import numpy as np
from evaluation_helpers import (
    loaded,
)

from cde_st.evaluation.prefixes import TaskPrefixes


class _RecordingModel:
    """Stands in for a SentenceTransformer: records which prompt each encode call used."""

    prompts = {"query": "Q: ", "document": ""}
    similarity_fn_name = "cosine"
    max_seq_length = 16

    def __init__(self):
        self.calls = []

    def _encode(self, kind, texts, prompt=None, **kwargs):
        self.calls.append((kind, prompt, list(texts)))
        return np.ones((len(texts), 4), dtype=np.float32)

    def encode(self, texts, **kw):
        return self._encode("encode", texts, **kw)

    def encode_query(self, texts, **kw):
        return self._encode("query", texts, **kw)

    def encode_document(self, texts, **kw):
        return self._encode("document", texts, **kw)

    def get_embedding_dimension(self):
        return 4


def test_wrapper_applies_prefixes_and_model_prompts(data_dir):
    from mteb.types import PromptType

    from cde_st.evaluation.models import build_model_meta
    from cde_st.evaluation.wrapper import ContextualEncoderWrapper

    task = loaded(data_dir / "sts" / "tinysts")
    model = _RecordingModel()
    meta = build_model_meta(model, name="test/recording", revision="r", experiment_kwargs={"context": "none"})
    loader = [{"text": ["a", "b"]}]
    with_prefixes = ContextualEncoderWrapper(model, plan=None, prefixes=TaskPrefixes(), model_meta=meta)
    with_prefixes.encode(loader, task_metadata=task.metadata, hf_split="test", hf_subset="default")
    assert model.calls[-1] == ("encode", "classification: ", ["a", "b"])
    ret = loaded(data_dir / "retrieval" / "tinyret")
    with_prefixes.encode(
        loader, task_metadata=ret.metadata, hf_split="test", hf_subset="default", prompt_type=PromptType.query
    )
    assert model.calls[-1][:2] == ("query", "search_query: ")
    # prefixes off: the model's own prompts, as mteb would choose them
    plain = ContextualEncoderWrapper(model, plan=None, prefixes=None, model_meta=meta)
    plain.encode(loader, task_metadata=ret.metadata, hf_split="test", hf_subset="default", prompt_type=PromptType.query)
    assert model.calls[-1][:2] == ("query", "Q: ")
    assert not plain.contextual
    # a model whose encode() applies a default prompt (cde_st: the document prompt) gets it named, so its
    # context documents get the same prefix
    model.prompts, model.default_prompt_name = {"query": "Q: ", "document": "D: "}, "document"
    plain.encode(loader, task_metadata=task.metadata, hf_split="test", hf_subset="default")
    assert model.calls[-1][:2] == ("encode", "D: ")
    assert plain._context_prompt(task.metadata) == "D: "


def test_sweep_runs_never_see_each_others_context(data_dir, make_tiny_cde, monkeypatch):
    """Runs of a sweep share one model: each encode must see exactly its own run's context (J=0: none)."""
    from cde_st.evaluation import evaluate_model
    from cde_st.evaluation.wrapper import ContextualEncoderWrapper

    model = make_tiny_cde(context_size=8)
    seen = []
    original = ContextualEncoderWrapper._ensure_context

    def spy(self, task_metadata, hf_subset, hf_split):
        original(self, task_metadata, hf_subset, hf_split)
        info = model.context_info
        seen.append((self.plan.size, task_metadata.name, None if info is None else info.size))

    monkeypatch.setattr(ContextualEncoderWrapper, "_ensure_context", spy)
    evaluate_model(
        model,
        ["tinysts", "tinyclu", "tinypair"],
        data_dir=data_dir,
        output_dir=None,
        batch_size=8,
        context_size=[0, 8],
        show_progress_bar=False,
    )
    assert {task for _, task, _ in seen} == {"tinysts", "tinyclu", "tinypair"}
    assert all(info is None for size, _, info in seen if size == 0)
    assert all(info == 8 for size, _, info in seen if size == 8)
