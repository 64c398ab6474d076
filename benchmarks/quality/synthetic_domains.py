"""Synthetic retrieval domains in which a word's weight is told only by the corpus it sits in.

Every domain draws its words from one shared vocabulary of real words (whole-word tokens of a BERT WordPiece
vocabulary, so each word is one token), under a Zipf law over the domain's own random permutation of that
vocabulary: the same word is a stop word in one domain and a rare, decisive term in another. A document is
``doc_words`` words drawn from its domain's law (with ``each_word_once``, each drawn word written once); a query is ``query_words`` distinct words of its target document
plus ``noise_words`` words drawn from the domain's law, shuffled. No single text says which of a query's words are
the rare ones; the corpus does.

Everything is deterministic given the seed: domain ``i`` draws from ``numpy.random.default_rng([seed, i])``, so the
training domains (0 .. train_domains - 1) and the held-out ones (after them) never share a permutation.

    >>> spec = DomainSpec(vocab_size=50, doc_words=8, query_words=2, noise_words=1)
    >>> vocab = [f"w{i}" for i in range(50)]
    >>> d = make_domain(vocab, spec, index=3, seed=0, documents=4, queries=2)
    >>> len(d.documents), len(d.queries), len(d.documents[0].split())
    (4, 2, 8)
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

__all__ = ["Domain", "DomainSpec", "make_domain", "read_vocabulary", "write_beir_folder", "write_pairs"]

# A whole word of the WordPiece vocabulary: lower-case letters and digits only, so not a continuation piece ("##...")
# nor a special token.
_WHOLE_WORD = re.compile(r"^[a-z0-9]+$")


@dataclass(frozen=True)
class DomainSpec:
    """The knobs of one domain's texts (every one a flag of the driver)."""

    vocab_size: int = 2000
    zipf: float = 1.2
    doc_words: int = 40
    query_words: int = 2
    noise_words: int = 2
    # Each document holds each of its drawn words once (in a random order): what a word is worth then depends on the
    # corpus alone, not also on how often it repeats within the text (which a mean-pooled embedding over-counts).
    each_word_once: bool = False

    def __post_init__(self) -> None:
        if self.vocab_size < 2 or self.doc_words < 1 or self.query_words < 1 or self.noise_words < 0:
            raise ValueError(f"vocab_size >= 2, doc_words >= 1, query_words >= 1, noise_words >= 0; got {self}.")
        if self.zipf <= 0:
            raise ValueError(f"zipf must be > 0, got {self.zipf}.")


@dataclass
class Domain:
    """One generated domain: its documents, its queries and each query's target document (an index)."""

    name: str
    documents: list[str]
    queries: list[str]
    targets: list[int]


def read_vocabulary(vocab_file: str | Path, size: int, seed: int, min_length: int = 3) -> list[str]:
    """``size`` whole words of a WordPiece ``vocab.txt`` (``min_length`` characters or more; shorter ones are mostly
    abbreviations and single letters in a real vocabulary), a seeded sample in vocabulary order."""
    lines = Path(vocab_file).read_text(encoding="utf-8").split("\n")
    words = [w for w in lines if _WHOLE_WORD.match(w) and len(w) >= min_length]
    if size > len(words):
        raise ValueError(
            f"{vocab_file} has {len(words)} whole words of {min_length} characters or more; asked for {size}."
        )
    chosen = np.random.default_rng([seed, 2**31 - 1]).choice(len(words), size, replace=False)
    return [words[i] for i in sorted(chosen)]


def zipf_law(spec: DomainSpec, rng: np.random.Generator) -> np.ndarray:
    """(V,) probabilities of the vocabulary's words: Zipf over ranks, ranks a random permutation of the words."""
    by_rank = 1.0 / np.arange(1, spec.vocab_size + 1) ** spec.zipf
    law = np.empty(spec.vocab_size)
    law[rng.permutation(spec.vocab_size)] = by_rank / by_rank.sum()
    return law


def _query(document: np.ndarray, law: np.ndarray, spec: DomainSpec, rng: np.random.Generator) -> np.ndarray:
    distinct = np.unique(document)
    taken = rng.choice(distinct, min(spec.query_words, len(distinct)), replace=False)
    noise = rng.choice(len(law), spec.noise_words, p=law)
    return rng.permutation(np.concatenate([taken, noise]))


def make_domain(vocab: list[str], spec: DomainSpec, *, index: int, seed: int, documents: int, queries: int) -> Domain:
    """Domain ``index`` under ``seed``: ``documents`` documents and ``queries`` queries, each for a distinct
    document (at most one query a document)."""
    if len(vocab) != spec.vocab_size:
        raise ValueError(f"{len(vocab)} words for vocab_size {spec.vocab_size}.")
    if queries > documents:
        raise ValueError(f"{queries} queries need as many documents; got {documents}.")
    rng = np.random.default_rng([seed, index])
    law = zipf_law(spec, rng)
    words = np.asarray(vocab)
    docs = rng.choice(spec.vocab_size, (documents, spec.doc_words), p=law)
    if spec.each_word_once:
        docs = [rng.permutation(np.unique(row)) for row in docs]
    targets = rng.choice(documents, queries, replace=False)
    query_rows = [_query(docs[t], law, spec, rng) for t in targets]
    return Domain(
        name=f"domain{index:04d}",
        documents=[" ".join(words[row]) for row in docs],
        queries=[" ".join(words[row]) for row in query_rows],
        targets=[int(t) for t in targets],
    )


def write_pairs(domains: list[Domain], path: Path) -> int:
    """Training pairs of ``domains`` as the trainer's JSONL (``query``, ``document``, ``domain``); the count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as out:
        for domain in domains:
            for query, target in zip(domain.queries, domain.targets):
                row = {"query": query, "document": domain.documents[target], "domain": domain.name}
                out.write(json.dumps(row) + "\n")
                count += 1
    return count


def write_beir_folder(domain: Domain, folder: Path) -> Path:
    """``domain`` as a BEIR folder (corpus.jsonl, queries.jsonl, qrels/test.tsv) that the eval kit scores."""
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with (folder / "corpus.jsonl").open("w", encoding="utf-8") as out:
        for i, text in enumerate(domain.documents):
            out.write(json.dumps({"_id": f"d{i}", "title": "", "text": text}) + "\n")
    with (folder / "queries.jsonl").open("w", encoding="utf-8") as out:
        for i, text in enumerate(domain.queries):
            out.write(json.dumps({"_id": f"q{i}", "text": text}) + "\n")
    with (folder / "qrels" / "test.tsv").open("w", encoding="utf-8") as out:
        out.write("query-id\tcorpus-id\tscore\n")
        for i, target in enumerate(domain.targets):
            out.write(f"q{i}\td{target}\t1\n")
    return folder


def spec_dict(spec: DomainSpec) -> dict:
    """The spec as the JSON the driver records."""
    return asdict(spec)
