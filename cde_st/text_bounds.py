"""Cutting a long text, before it is tokenised, to a prefix that yields the same tokens once truncated.

A fast tokenizer asked to truncate to ``max_length`` tokens still tokenises the whole text first: a 5 MB text costs
seconds and hundreds of MB of offsets and ids, only to keep 512 tokens. :func:`bound_text` cuts the text to a prefix
that provably keeps the first ``max_length`` tokens unchanged, so every tokenising path of the library (encode, the
evaluator, training, the context's first stage and the server) reads a bounded amount of text.

Why the prefix keeps the kept tokens. Let a *separator* be one of ``' '``, ``'\\t'``, ``'\\n'``, ``'\\r'``, and a
*counted word* a maximal run of non-separator characters holding at least one letter or digit (Python's ``\\w``
minus ``_``: Unicode categories L and N). The prefix ends at the end of the ``max_length``-th counted word.

1. Tokens never cross a separator, and the tokens before a separator do not depend on what follows it. Every
   tokenizer family sentence-transformers models use splits the (normalised) text at whitespace before its model
   runs, and the model then tokenises each piece alone: WordPiece (BERT: ``BertPreTokenizer``), byte-level BPE
   (GPT-2, RoBERTa, ModernBERT: its split regex keeps a run of whitespace apart, the space before a word going
   with that word) and SentencePiece (``Metaspace``: pieces hold no inner ``▁``, so even a whole-string Unigram
   or BPE segmentation decomposes word by word). The four separators are whitespace for all of them; other
   Unicode spaces are not assumed to be (BERT keeps U+2028 inside a word, and drops U+001C as a control), so
   they count as part of a word, which can only make the count smaller.
2. Each counted word yields at least one token. Normalisers drop control and format characters (category C),
   U+FFFD and combining marks (BERT's accent stripping, category Mn); a letter or digit survives every one of
   them (NFKC and lower-casing map it to a non-empty string, accent stripping keeps its base), and a model maps
   any surviving piece to at least one token (``[UNK]`` at worst). Punctuation and symbols are not counted: the
   bound never relies on them.

So the prefix yields at least ``max_length`` tokens before the cut, the same as the full text yields there, and
truncation to ``max_length`` (special tokens included, which only lowers the text's share) keeps only tokens
from before the cut: the ids are those of the untruncated text truncated. The cut applies to right-side
truncation only (a tokenizer with ``truncation_side="left"`` keeps the end; its texts are left whole).

What the bound does not shorten: a text whose first ``max_length`` counted words are themselves huge (one
whitespace-free run of megabytes) is kept up to the end of them; tokenizers treat such a run as one word (BERT
reads a word of over 100 characters as one ``[UNK]`` in time linear in its length).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["SEPARATORS", "bound_text", "bound_texts"]

#: The characters every supported tokenizer treats as whitespace (where its pre-tokenizer splits).
SEPARATORS = " \t\n\r"
_RUN = re.compile(f"[^{re.escape(SEPARATORS)}]+")
_LETTER_OR_DIGIT = re.compile(r"[^\W_]")


def bound_text(text: str, max_tokens: int) -> str:
    """``text`` cut after its ``max_tokens``-th counted word (a run between separators holding a letter or a
    digit): tokenising the result and truncating to ``max_tokens`` gives the ids that tokenising ``text`` whole
    and truncating gives (the argument is in this module's docstring). Texts shorter than that come back as they
    are, at the cost of one scan; a long one costs a scan of its prefix only.

    >>> bound_text("one two three four", 2)
    'one two'
    >>> bound_text("a !! b", 2)  # "!!" holds no letter or digit: it is not counted
    'a !! b'
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}.")
    if len(text) <= max_tokens:  # fewer characters than the words needed for a cut
        return text
    counted = 0
    for run in _RUN.finditer(text):
        if _LETTER_OR_DIGIT.search(run.group()):
            counted += 1
            if counted == max_tokens:
                return text[: run.end()]
    return text


def bound_texts(texts: Sequence[str], max_tokens: int, tokenizer=None) -> list[str]:
    """:func:`bound_text` over ``texts``; left as they are when ``tokenizer`` truncates on the left (it keeps
    the end of a text, which a prefix would drop)."""
    if tokenizer is not None and getattr(tokenizer, "truncation_side", "right") != "right":
        return list(texts)
    return [bound_text(text, max_tokens) for text in texts]
