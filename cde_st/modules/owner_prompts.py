"""The prompts of a :class:`~cde_st.modules.ContextualTransformer`, read through the model that holds it.

Inside a SentenceTransformer the model's ``prompts`` (sentence-transformers' own, saved in
``config_sentence_transformers.json``) are the one stored copy: ``query_prompt`` and ``document_prompt`` read and
write them, so ``model[0].set_context`` prefixes the context with the document prompt the model has now. Prompts a
module was given before it joined a model (explicitly, or from a ``cde_config.json`` written by older cde_st) seed
the model's where it has none, and are then dropped. A module outside any model uses its explicit prompts, else
cde_st's defaults (:data:`cde_st.prompts.DEFAULT_PROMPTS`).
"""

from __future__ import annotations

import weakref
from typing import Any

from cde_st.prompts import DEFAULT_PROMPTS


class OwnerPrompts:
    """Mixin of :class:`~cde_st.modules.ContextualTransformer`: a weak link to the model that holds the module
    (kept across pickling) and the prompts read through it. ``self._prompts`` holds the explicit prompts until the
    module joins a model."""

    def on_model_ready(self, model) -> None:
        """sentence-transformers' hook once the model holding this module is built: link to it, seed its prompts."""
        self._owner = weakref.ref(model)  # weak: the model owns the module, not the other way round
        if self._prompts:
            if getattr(model, "prompts", None) is None:
                model.prompts = {}
            for name, value in self._prompts.items():
                if not model.prompts.get(name):  # the model's own prompts win; these fill the gaps
                    model.prompts[name] = value
            self._prompts = {}

    def _owner_model(self):
        owner = self.__dict__.get("_owner")
        model = owner() if owner is not None else None
        if model is None or not any(m is self for m in model._modules.values()):
            return None
        return model

    def _prompt(self, name: str) -> str:
        model = self._owner_model()
        if model is None:
            return self._prompts.get(name, DEFAULT_PROMPTS[name])
        return (getattr(model, "prompts", None) or {}).get(name) or ""

    def _set_prompt(self, name: str, value: str) -> None:
        model = self._owner_model()
        if model is None:
            self._prompts[name] = value
            return
        if getattr(model, "prompts", None) is None:
            model.prompts = {}
        model.prompts[name] = value

    @property
    def query_prompt(self) -> str:
        """The prompt queries are embedded with (``model.prompts["query"]`` inside a model)."""
        return self._prompt("query")

    @query_prompt.setter
    def query_prompt(self, value: str) -> None:
        self._set_prompt("query", value)

    @property
    def document_prompt(self) -> str:
        """The prompt documents and the context documents are embedded with (``model.prompts["document"]``)."""
        return self._prompt("document")

    @document_prompt.setter
    def document_prompt(self, value: str) -> None:
        self._set_prompt("document", value)

    def __getstate__(self) -> dict[str, Any]:
        # A weak reference cannot be pickled (multi-process pools pickle the model): pickle the owner itself, which
        # is the model being pickled, so the copy points at the copied model.
        state = super().__getstate__().copy()
        owner = state.pop("_owner", None)
        state["_owner_model"] = owner() if owner is not None else None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        model = state.pop("_owner_model", None)
        super().__setstate__(state)
        self._owner = weakref.ref(model) if model is not None else None
