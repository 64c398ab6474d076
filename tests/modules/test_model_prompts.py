"""The module's prompts read through the model that holds it (cde_st/modules/model_prompts.py): one stored copy in
``model.prompts``; a module alone uses its own or cde_st's defaults; the link survives pickling."""

from __future__ import annotations

import pickle

from sentence_transformers import SentenceTransformer

from cde_st import ContextualTransformer
from cde_st.prompts import DEFAULT_PROMPTS


def test_a_module_alone_uses_its_explicit_prompts_else_the_defaults(tiny_bert_dir):
    module = ContextualTransformer.from_encoder(tiny_bert_dir, context_size=2, query_prompt="q: ")
    assert module.query_prompt == "q: "
    assert module.document_prompt == DEFAULT_PROMPTS["document"]
    module.document_prompt = "d: "
    assert module.document_prompt == "d: "


def test_inside_a_model_the_models_prompts_are_the_one_copy(tiny_bert_dir):
    module = ContextualTransformer.from_encoder(
        tiny_bert_dir, context_size=2, query_prompt="q: ", document_prompt="d: "
    )
    model = SentenceTransformer(modules=[module], prompts={"query": "model q: "})
    assert module.query_prompt == "model q: "  # the model's own prompt wins
    assert model.prompts["document"] == "d: "  # the module's fills the gap
    module.document_prompt = "new d: "
    assert model.prompts["document"] == "new d: "  # written through to the model
    model.prompts["query"] = ""
    assert module.query_prompt == ""  # an empty prompt is a prompt, not a fall-back to the defaults


def test_a_module_taken_out_of_its_model_stops_reading_it(tiny_bert_dir):
    module = ContextualTransformer.from_encoder(tiny_bert_dir, context_size=2)
    model = SentenceTransformer(modules=[module], prompts={"query": "model q: "})
    assert module.query_prompt == "model q: "
    del model._modules["0"]
    assert module.query_prompt == DEFAULT_PROMPTS["query"]


def test_a_pickled_copy_reads_the_copied_model(tiny_bert_dir):
    module = ContextualTransformer.from_encoder(tiny_bert_dir, context_size=2)
    model = SentenceTransformer(modules=[module], prompts={"query": "q: ", "document": "d: "})
    copy = pickle.loads(pickle.dumps(model))
    copy.prompts["query"] = "copied q: "
    assert copy[0].query_prompt == "copied q: "
    assert module.query_prompt == "q: "  # the original is untouched
