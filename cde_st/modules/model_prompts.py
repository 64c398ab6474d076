"""The prompts of a :class:`~cde_st.modules.ContextualTransformer`, read through the model that holds it.

Inside a SentenceTransformer the model's ``prompts`` (sentence-transformers' own, saved in
``config_sentence_transformers.json``) are the one stored copy: ``query_prompt`` and ``document_prompt`` read and
write them, so ``model[0].set_context`` prefixes the context with the document prompt the model has now. Prompts a
module was given before it joined a model (explicitly, or from a ``cde_config.json`` written by older cde_st) seed
the model's where it has none, and are then dropped. A module outside any model uses its explicit prompts, else
cde_st's defaults (:data:`cde_st.prompts.DEFAULT_PROMPTS`).

Example:
    >>> prompts = ModelPrompts({"query": "q: "})
    >>> prompts.get("query", module)       # no model yet: the explicit prompt
    'q: '
"""

from __future__ import annotations

import weakref
from typing import Any

from torch import nn

from cde_st.prompts import DEFAULT_PROMPTS


class ModelPrompts:
    """A module's prompts: a weak link to the model holding the module (kept across pickling) and the explicit
    prompts, kept until the module joins a model. Every call names the module it answers for, which must still
    be one of the model's modules for the model's prompts to count."""

    def __init__(self, explicit: dict[str, str]) -> None:
        self.explicit = dict(explicit)
        self._model: weakref.ref | None = None  # weak: the model owns the module, not the other way round
        self._lengths: dict[str, int] = {}  # prompt -> its token count

    def length(self, prompt: str, tokenizer: Any) -> int:
        """How many of the first tokens of a prompted text are the prompt's (for pooling without the prompt)."""
        if prompt not in self._lengths:
            ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
            # [CLS] prompt [SEP]: the trailing special token is not part of the prompt.
            self._lengths[prompt] = len(ids) - (1 if ids and ids[-1] in tokenizer.all_special_ids else 0)
        return self._lengths[prompt]

    def join(self, model: Any) -> None:
        """The module joined ``model`` (sentence-transformers' ``on_model_ready``): link to it, seed its prompts."""
        self._model = weakref.ref(model)
        if self.explicit:
            if getattr(model, "prompts", None) is None:
                model.prompts = {}
            for name, value in self.explicit.items():
                if not model.prompts.get(name):  # the model's own prompts win; these fill the gaps
                    model.prompts[name] = value
            self.explicit = {}

    def holder(self, module: nn.Module) -> Any:
        """The model that holds ``module`` now (None: none, or it was taken out)."""
        model = self._model() if self._model is not None else None
        if model is None or not any(m is module for m in model._modules.values()):
            return None
        return model

    def get(self, name: str, module: nn.Module) -> str:
        """The ``name`` prompt ("query", "document") of ``module``."""
        model = self.holder(module)
        if model is None:
            return self.explicit.get(name, DEFAULT_PROMPTS[name])
        return (getattr(model, "prompts", None) or {}).get(name) or ""

    def set(self, name: str, value: str, module: nn.Module) -> None:
        """Set the ``name`` prompt of ``module`` (in its model's ``prompts`` when it has one)."""
        model = self.holder(module)
        if model is None:
            self.explicit[name] = value
            return
        if getattr(model, "prompts", None) is None:
            model.prompts = {}
        model.prompts[name] = value

    def __getstate__(self) -> dict[str, Any]:
        # A weak reference cannot be pickled (multi-process pools pickle the model): pickle the model itself, which
        # is the model being pickled, so the copy points at the copied model.
        model = self._model() if self._model is not None else None
        return {"explicit": self.explicit, "model": model}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.explicit = state["explicit"]
        self._lengths = {}
        model = state["model"]
        self._model = weakref.ref(model) if model is not None else None


def prompt_property(name: str, doc: str) -> property:
    """The ``name`` prompt ("query", "document") of a module that holds its :class:`ModelPrompts` as
    ``model_prompts``, as a settable attribute."""
    return property(
        lambda module: module.model_prompts.get(name, module),
        lambda module, value: module.model_prompts.set(name, value, module),
        doc=doc,
    )
