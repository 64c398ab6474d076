"""A small randomly initialised BERT whose vocabulary is a corpus-statistics benchmark's words: the fast base model of
that benchmark's small setting, where a run trains in a minute or two on a CPU.

Each benchmark word is one token (plus BERT's special tokens and the ASCII punctuation and digits the prompts use),
so at initialisation mean pooling is close to a bag of near-orthogonal word vectors: a lexical matcher that weighs
every word alike, as BM25 without IDF does. Whether a model learns to weigh them by their rarity in the corpus is
then the question, not whether it learns to read the words at all.

    python benchmarks/quality/word_encoder.py --data runs/corpus_stats/small --out runs/corpus_stats/small-encoder
"""

from __future__ import annotations

import argparse
import json
import string
from pathlib import Path

import torch
from transformers import BertConfig, BertModel, BertTokenizerFast

from cde_st.training.tiny import write_sentence_transformers_files

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def benchmark_words(data: Path) -> list[str]:
    """The vocabulary a generated benchmark folder was drawn from (its generator.json), in order."""
    generator = json.loads((data / "generator.json").read_text())
    return generator["vocabulary"]


def build_word_encoder(
    out: Path, words: list[str], hidden: int, layers: int, heads: int, seed: int, positions: bool = True
) -> Path:
    """Write a random BERT (``hidden`` wide, ``layers`` deep) with a WordPiece tokenizer over ``words`` to ``out``.
    ``positions=False`` zeroes the position embeddings at initialisation: the benchmark's texts are bags of words,
    and a position vector shared by every text is a component common to all embeddings that hides the words."""
    out.mkdir(parents=True, exist_ok=True)
    marks = sorted(set(string.punctuation + string.digits) - set(words))
    vocab = SPECIALS + marks + [w for w in words if w not in marks]
    (out / "vocab.txt").write_text("".join(token + "\n" for token in vocab), encoding="utf-8")
    tokenizer = BertTokenizerFast(vocab=str(out / "vocab.txt"), do_lower_case=True)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=512,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = BertModel(config, add_pooling_layer=False)
    if not positions:
        with torch.no_grad():
            model.embeddings.position_embeddings.weight.zero_()
            model.embeddings.token_type_embeddings.weight.zero_()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_sentence_transformers_files(out, hidden)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a folder written by corpus_statistics.py generate")
    parser.add_argument("--out", required=True)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-positions", action="store_true", help="zero the position embeddings at initialisation")
    args = parser.parse_args()
    path = build_word_encoder(
        Path(args.out),
        benchmark_words(Path(args.data)),
        args.hidden,
        args.layers,
        args.heads,
        args.seed,
        positions=not args.no_positions,
    )
    print(path)


if __name__ == "__main__":
    main()
