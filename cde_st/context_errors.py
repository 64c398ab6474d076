"""What can go wrong with a named context or the model serving it, as exceptions that know nothing of HTTP.

The context store and the engine raise these, and the context file reader (:mod:`cde_st.context_files`) raises
:class:`ContextDamaged` for ``cde-st-embed --context`` too; the HTTP routes (:mod:`cde_st.serving.app`) map each
class to a status and OpenAI's error body, so the store and the engine stay usable from a script or a test without
a server.
Each carries ``code`` (a short machine-readable name, answered as the error's ``code``) and ``param`` (the request
field at fault, if any).
"""

from __future__ import annotations

__all__ = [
    "ContextBusy",
    "ContextDamaged",
    "ContextError",
    "ContextExists",
    "ContextModelMismatch",
    "ContextNotFound",
    "ContextReserved",
    "ContextTooLarge",
    "InvalidContextName",
    "NonFiniteEmbedding",
    "StateDirError",
]


class ContextError(Exception):
    """A request about a context cannot be served; ``code`` names which fault, ``param`` the field at fault."""

    code = "context_error"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidContextName(ContextError, ValueError):
    """A name that cannot name a context (nor a file)."""

    code = "invalid_context_name"


class ContextTooLarge(ContextError, ValueError):
    """A context size larger than the model's J context slots."""

    code = "context_too_large"


class ContextNotFound(ContextError, LookupError):
    """No context of that name is stored."""

    code = "context_not_found"


class ContextExists(ContextError):
    """The name is taken (stored, or being created) and no replace was asked."""

    code = "context_exists"


class ContextBusy(ContextError):
    """The context is being created; it cannot be deleted until that ends."""

    code = "context_busy"


class ContextReserved(ContextError):
    """The name of the model folder's own context, which cannot be created or deleted."""

    code = "context_name_reserved"


class ContextModelMismatch(ContextError):
    """The stored context was made by another model: its vectors mean nothing to this one."""

    code = "context_model_mismatch"


class ContextDamaged(ContextError):
    """The stored context's file is damaged (checksum, format or non-finite values): it can only be replaced or
    deleted."""

    code = "context_damaged"


class NonFiniteEmbedding(ContextError, ArithmeticError):
    """A forward gave NaN or infinite values: they are never answered as embeddings."""

    code = "non_finite_embedding"


class StateDirError(RuntimeError):
    """The state directory cannot be used (missing permission, not a directory); the message names it."""
