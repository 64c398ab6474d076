"""Model folders load whole or not at all: a folder that is missing its tokenizer, holds weights that do
not fit its config, or NaN weights is an error naming the folder, the file and the field, in the native and the
released layout; the released route honours ``model_kwargs``; a missing encoder folder or uncached hub id is named
as such."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoTokenizer

from cde_st import ContextualSentenceTransformer
from cde_st.modules.integrity import MIN_VOCAB_FRACTION
from cde_st.released import ReleasedCheckpointError

FIXTURE = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "cde_reference"
DOCS = ["The cat sat on the mat.", "Rain forms when water vapour condenses.", "Coffee contains caffeine."]
WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def saved_folder(tmp_path_factory, tiny_bert_dir) -> Path:
    """A tiny native model (BERT, hidden 32, 2 layers, 2 heads) saved once per module; tests break copies."""
    torch.manual_seed(0)
    model = ContextualSentenceTransformer.from_encoder(tiny_bert_dir, context_size=4, max_seq_length=32)
    path = tmp_path_factory.mktemp("saved") / "cde"
    model.save(str(path))
    return path


@pytest.fixture
def folder(saved_folder, tmp_path) -> Path:
    copy = tmp_path / "cde"
    shutil.copytree(saved_folder, copy)
    return copy


@pytest.fixture
def released_v2(tmp_path) -> Path:
    if not (FIXTURE / "v2" / WEIGHTS).is_file():
        pytest.skip(f"CDE reference fixture not found at {FIXTURE}")
    copy = tmp_path / "v2"
    shutil.copytree(FIXTURE / "v2", copy)
    return copy


def _edit_weights(path: Path, edit=None, metadata=True) -> None:
    """Rewrite a safetensors file: ``edit(tensors)`` changes the tensors in place; ``metadata=False`` drops what
    cde_st records (a folder saved before it did)."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    if edit is not None:
        edit(tensors)
    if not metadata:
        meta = {k: v for k, v in meta.items() if not k.startswith("cde_st.")}
    save_file(tensors, str(path), metadata=meta)


def _edit_stage_config(folder: Path, stage: str, **changes) -> None:
    path = folder / "cde_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config[f"{stage}_config"].update(changes)
    path.write_text(json.dumps(config), encoding="utf-8")


def _tiny_vocab(folder: Path) -> int:
    """Rows of the saved model's token embedding table (the tiny encoder's vocabulary)."""
    with safe_open(str(folder / WEIGHTS), framework="pt") as f:
        return f.get_slice("first_stage.embeddings.word_embeddings.weight").get_shape()[0]


def _load(folder: Path, **kwargs):
    return ContextualSentenceTransformer(str(folder), **kwargs)


# ---------------------------------------------------------------- the tokenizer
def test_save_records_configs_and_tokenizer_size(saved_folder):
    from cde_st.modules.integrity import META_CONFIG, META_TOKENIZER_SIZE

    with safe_open(str(saved_folder / WEIGHTS), framework="pt") as f:
        meta = f.metadata()
    assert meta[META_TOKENIZER_SIZE] == str(len(AutoTokenizer.from_pretrained(str(saved_folder))))
    assert json.loads(meta[META_CONFIG.format(stage="second_stage")])["num_attention_heads"] == 2


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "saved_before_recording"])
def test_missing_tokenizer_json_is_named(folder, recorded):
    """Without tokenizer.json transformers builds a 5-token tokenizer from tokenizer_config.json (every word [UNK])."""
    (folder / "tokenizer.json").unlink()
    _edit_weights(folder / WEIGHTS, metadata=recorded)
    with pytest.raises(ValueError, match=r"tokenizer\.json is missing") as info:
        _load(folder)
    message = str(info.value)
    assert str(folder) in message and WEIGHTS in message
    size = _tiny_vocab(folder)
    assert (f"saved with a {size}-token tokenizer" if recorded else f"only 5 tokens for the {size} rows") in message


def test_missing_tokenizer_files_are_named(folder):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    with pytest.raises(ValueError, match=r"tokenizer.*files: none"):
        _load(folder)


def _save_foreign_tokenizer(folder: Path, size: int) -> None:
    """Replace the folder's tokenizer by another model's: a WordPiece tokenizer of ``size`` tokens."""
    from transformers import BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"word{i}" for i in range(size - 5)]
    (folder / "foreign_vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(vocab=str(folder / "foreign_vocab.txt"))
    assert len(tokenizer) == size
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    tokenizer.save_pretrained(folder)


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "saved_before_recording"])
def test_foreign_tokenizer_is_named(folder, recorded):
    """Another model's tokenizer, with far fewer tokens than the weights' embedding rows, beside the weights."""
    size = _tiny_vocab(folder)
    foreign = int(MIN_VOCAB_FRACTION * size) // 2
    _save_foreign_tokenizer(folder, foreign)
    _edit_weights(folder / WEIGHTS, metadata=recorded)
    match = (
        rf"{foreign} tokens, but the model was saved with a {size}-token"
        if recorded
        else rf"only {foreign} tokens for the {size}"
    )
    with pytest.raises(ValueError, match=match):
        _load(folder)


def test_tokenizer_beyond_embedding_table_is_named(released_v2, tiny_bert_dir):
    """The tiny encoder's tokenizer (more than 128 tokens) for a 128-row table: ids past the table (an index error
    at encode time, if any)."""
    top = max(AutoTokenizer.from_pretrained(tiny_bert_dir).get_vocab().values())
    with pytest.raises(ReleasedCheckpointError, match=rf"token ids up to {top}, beyond the 128 rows"):
        _load(released_v2, tokenizer=tiny_bert_dir)


def test_released_folder_without_tokenizer_files_is_named(released_v2):
    """The released layout: tokenizer_config.json alone gives a 5-token tokenizer for a 128-row table."""
    for name in ("tokenizer.json", "vocab.txt"):
        (released_v2 / name).unlink()
    with pytest.raises(ReleasedCheckpointError, match=r"tokenizer\.json is missing.*only 5 tokens for the 128 rows"):
        _load(released_v2)


# ---------------------------------------------------------------- the weights against the config
@pytest.mark.parametrize(
    ("stage", "field", "value", "saved"),
    [
        ("second_stage", "num_attention_heads", 4, 2),
        ("first_stage", "num_hidden_layers", 1, 2),
        ("second_stage", "intermediate_size", 128, 64),
        ("first_stage", "hidden_act", "relu", "gelu"),
        ("second_stage", "layer_norm_eps", 1e-5, 1e-12),
    ],
)
def test_config_edited_after_save_is_named(folder, stage, field, value, saved):
    """Every field that changes the computation, including those no tensor shape shows (heads, activation, eps)."""
    _edit_stage_config(folder, stage, **{field: value})
    with pytest.raises(
        ValueError, match=rf"cde_config\.json: {stage}_config.*{field}={value!r} \(saved with {saved!r}\)"
    ):
        _load(folder)


def test_layers_mismatch_without_record_is_named(folder):
    _edit_weights(folder / WEIGHTS, metadata=False)
    _edit_stage_config(folder, "first_stage", num_hidden_layers=1)
    with pytest.raises(
        ValueError,
        match=r"model\.safetensors does not match .*cde_config\.json.*unexpected.*"
        r"first_stage has 2 layers in the file, 1 by the config",
    ):
        _load(folder)


def test_width_mismatch_without_record_is_named(folder):
    _edit_weights(folder / WEIGHTS, metadata=False)
    _edit_stage_config(folder, "second_stage", intermediate_size=128)
    with pytest.raises(
        ValueError,
        match=r"shape mismatch.*second_stage\.encoder\.layer\.0\.intermediate\.dense\.weight: "
        r"\(64, 32\) in the file, \(128, 32\) by the config",
    ):
        _load(folder)


def test_missing_extra_and_misshaped_tensors_are_named(folder):
    def edit(tensors):
        del tensors["second_stage.encoder.layer.1.output.dense.weight"]
        tensors["second_stage.pooler.dense.weight"] = torch.zeros(32, 32)
        tensors["null_vector"] = torch.zeros(16)

    _edit_weights(folder / WEIGHTS, edit)
    with pytest.raises(ValueError) as info:
        _load(folder)
    message = str(info.value)
    assert f"{folder / WEIGHTS} does not match {folder / 'cde_config.json'}" in message
    assert "1 missing tensor(s) ['second_stage.encoder.layer.1.output.dense.weight']" in message
    assert "1 unexpected tensor(s) ['second_stage.pooler.dense.weight']" in message
    assert "null_vector: (16,) in the file, (32,) by the config" in message


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_named(folder, value):
    def edit(tensors):
        tensors["first_stage.encoder.layer.0.attention.self.query.weight"][3, 5] = value

    _edit_weights(folder / WEIGHTS, edit)
    with pytest.raises(
        ValueError,
        match=r"model\.safetensors holds NaN or infinite values in 1 tensor\(s\): "
        r"\['first_stage\.encoder\.layer\.0\.attention\.self\.query\.weight'\]",
    ):
        _load(folder)


def test_released_non_finite_weights_are_named(released_v2):
    def edit(tensors):
        tensors["second_stage_model.output_projection.0.weight"][0, 0] = float("nan")

    _edit_weights(released_v2 / WEIGHTS, edit)
    with pytest.raises(ReleasedCheckpointError, match=r"model\.safetensors holds NaN.*\['head\.fc1\.weight'\]"):
        _load(released_v2)


def test_released_backbone_config_mismatch_is_named(released_v2):
    path = released_v2 / "backbone_config.json"
    raw = json.loads(path.read_text(encoding="utf-8"))
    raw["num_hidden_layers"] += 1
    path.write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(
        ReleasedCheckpointError,
        match=r"model\.safetensors does not match the modernbert config "
        r".*backbone_config\.json.*missing tensor",
    ):
        _load(released_v2)


# ---------------------------------------------------------------- correct folders: unchanged
def test_whole_folder_round_trip_is_exact(saved_folder, tmp_path):
    model = _load(saved_folder)
    model.set_context(DOCS, seed=0)
    model.save(str(tmp_path / "again"))
    again = _load(tmp_path / "again")
    torch.testing.assert_close(
        again.encode_document(DOCS, convert_to_tensor=True),
        model.encode_document(DOCS, convert_to_tensor=True),
        rtol=0,
        atol=0,
    )


# ---------------------------------------------------------------- model_kwargs on the released route
def test_released_route_honours_dtype(released_v2):
    reference = _load(released_v2)
    model = _load(released_v2, model_kwargs={"torch_dtype": torch.bfloat16})
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    reference.set_context(DOCS, seed=0)
    model.set_context(DOCS, seed=0)
    got = model.encode_document(DOCS, convert_to_tensor=True).float()
    torch.testing.assert_close(got, reference.encode_document(DOCS, convert_to_tensor=True), atol=0.05, rtol=0.05)
    assert {p.dtype for p in _load(released_v2, model_kwargs={"dtype": "auto"}).parameters()} == {torch.float32}


def test_released_route_honours_attn_implementation(released_v2, tmp_path):
    model = _load(released_v2, model_kwargs={"attn_implementation": "eager"})
    module = model.contextual_module
    assert module.second_stage.config._attn_implementation == "eager"
    assert module.first_stage.config._attn_implementation == "eager"
    reference = _load(released_v2)
    for m in (model, reference):
        m.set_context(DOCS, seed=0)
    torch.testing.assert_close(
        model.encode_query(DOCS, convert_to_tensor=True),
        reference.encode_query(DOCS, convert_to_tensor=True),
        atol=1e-5,
        rtol=1e-5,
    )
    model.save(str(tmp_path / "converted"))  # the load-time kernel is not written into the converted folder
    assert json.loads((tmp_path / "converted" / "cde_config.json").read_text())["attn_implementation"] == "sdpa"


def test_released_route_names_ignored_model_kwargs(released_v2):
    with pytest.warns(UserWarning, match=r"load_released ignores model_kwargs\['low_cpu_mem_usage'\]"):
        _load(released_v2, model_kwargs={"low_cpu_mem_usage": True})
    with pytest.raises(ValueError, match=r"dtype='float99'"):
        _load(released_v2, model_kwargs={"dtype": "float99"})


# ---------------------------------------------------------------- from_encoder: missing folder, uncached hub id
@pytest.mark.parametrize("name", ["./models/missing", "models/missing/deeper", "/no/such/encoder"])
def test_from_encoder_missing_folder_is_named(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"does not exist") as info:
        ContextualSentenceTransformer.from_encoder(name)
    assert os.path.abspath(os.path.expanduser(name)) in str(info.value)


@pytest.mark.parametrize("name", ["models/missing", "no_such_encoder"])
def test_from_encoder_uncached_hub_id_offline_is_named(tmp_path, monkeypatch, name):
    """'models/missing' is either a folder that does not exist or a hub id, and so is a legacy owner-less id such
    as 'bert-base-uncased': offline, neither can be had."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(FileNotFoundError) as info:
            ContextualSentenceTransformer.from_encoder(name)
    message = str(info.value)
    assert f"'{name}'" in message and str(tmp_path / name) in message
    assert "not in the Hugging Face cache" in message


def test_pytorch_bin_folder_is_checked_too(make_tiny_cde, tmp_path):
    """safe_serialization=False writes pytorch_model.bin (no metadata): it loads exactly, and NaN in it is named."""
    model = make_tiny_cde(context_size=4)
    path = tmp_path / "bin"
    model.save(str(path), safe_serialization=False)
    assert (path / "pytorch_model.bin").is_file() and not (path / WEIGHTS).exists()
    torch.testing.assert_close(
        _load(path).encode_query(DOCS, convert_to_tensor=True),
        model.encode_query(DOCS, convert_to_tensor=True),
        rtol=0,
        atol=0,
    )
    state = torch.load(path / "pytorch_model.bin", weights_only=True)
    state["null_vector"][0] = float("nan")
    torch.save(state, path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"pytorch_model\.bin holds NaN.*\['null_vector'\]"):
        _load(path)


# ---------------------------------------------------------------- a save is checked as a whole
@pytest.fixture
def two_saves(tmp_path, make_tiny_cde) -> tuple[Path, Path]:
    """``final`` and ``checkpoint``: the same model saved before and after an optimizer step, each with its
    context (the same documents, embedded by its own weights), as a training run leaves them."""
    model = make_tiny_cde(context_size=4)
    model.set_context(DOCS, seed=0)
    checkpoint, final = tmp_path / "checkpoint-1", tmp_path / "final"
    model.save(str(checkpoint))
    params = list(model.parameters())
    for p in params:
        p.grad = torch.full_like(p, 0.1)
    torch.optim.SGD(params, lr=0.5).step()
    model.save(str(final))
    return final, checkpoint


@pytest.mark.parametrize("name", [WEIGHTS, "context.safetensors"])
def test_a_file_copied_from_another_save_is_named(two_saves, name):
    """A checkpoint's weights (or context) copied over final/: the context would be one made for other weights."""
    final, checkpoint = two_saves
    shutil.copyfile(checkpoint / name, final / name)
    with pytest.raises(ValueError, match=rf"{name} .*not written with the other files of this save") as info:
        _load(final)
    assert str(final) in str(info.value) and "save" in str(info.value)


def _swap_two_ids(folder: Path) -> None:
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    a, b = [token for token in vocab if not token.startswith("[")][:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(data), encoding="utf-8")


def _no_lowercasing(folder: Path) -> None:
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["normalizer"]["lowercase"] = False
    path.write_text(json.dumps(data), encoding="utf-8")
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["do_lower_case"] = False
    config_path.write_text(json.dumps(config), encoding="utf-8")


@pytest.mark.parametrize("change", [_swap_two_ids, _no_lowercasing], ids=["two_ids_swapped", "no_lowercasing"])
def test_a_tokenizer_changed_at_the_same_size_is_named(two_saves, change):
    final, _ = two_saves
    change(final)
    with pytest.raises(ValueError, match=r"tokenizer.*not written with the other files of this save"):
        _load(final)


def test_weights_file_the_save_did_not_write_is_named(two_saves, make_tiny_cde):
    """A pytorch_model.bin save into a folder that still holds an older model.safetensors: loading would take the
    older file."""
    final, _ = two_saves
    model = make_tiny_cde(context_size=4, seed=5)
    model.set_context(DOCS, seed=0)
    model.save(str(final), safe_serialization=False)
    with pytest.raises(ValueError, match=rf"{WEIGHTS} .*not written with the other files of this save"):
        _load(final)


def test_a_whole_save_loads_and_a_save_without_a_record_loads_as_before(two_saves):
    from cde_st.modules.integrity import MANIFEST_FILE

    final, _ = two_saves
    expected = _load(final).encode_query(DOCS, convert_to_tensor=True)
    (final / MANIFEST_FILE).unlink()  # a folder saved before saves were recorded
    torch.testing.assert_close(_load(final).encode_query(DOCS, convert_to_tensor=True), expected, rtol=0, atol=0)


def test_converted_released_folder_is_checked_as_a_whole(released_v2, tmp_path):
    """cde-st-convert writes a native folder: it carries the record of its save, so a tokenizer edited there at the
    same size is named too."""
    from cde_st.convert_command import convert_run

    converted = tmp_path / "converted"
    assert convert_run([str(released_v2), str(converted)]) == 0
    _load(converted)  # whole: loads
    _swap_two_ids(converted)
    with pytest.raises(ValueError, match=r"tokenizer\.json .*not written with the other files of this save"):
        _load(converted)


def _deny_reading(monkeypatch, path: Path) -> None:
    """Make ``path`` unreadable to this process: by its mode, and (root reads any file) as the OS answers others."""
    from cde_st.modules import integrity

    os.chmod(path, 0)
    if os.geteuid() == 0:
        real_open = open

        def denied(file, *args, **kwargs):
            if os.fspath(file) == str(path):
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(file, *args, **kwargs)

        monkeypatch.setattr(integrity, "open", denied, raising=False)


@pytest.mark.parametrize("name", [WEIGHTS, "context.safetensors"])
def test_saved_files_get_the_umask_s_mode_and_an_unreadable_one_is_named(name, tiny_bert_dir, tmp_path, monkeypatch):
    """safetensors writes 0o600 files (another user's load then failed with "No such file or directory"): a save
    gives them the umask's mode, and a file this process may not read is reported as a permission error."""
    torch.manual_seed(0)
    model = ContextualSentenceTransformer.from_encoder(tiny_bert_dir, context_size=4, max_seq_length=32)
    model.set_context(DOCS, seed=0)
    previous = os.umask(0o022)
    try:
        model.save(str(tmp_path / "cde"))
    finally:
        os.umask(previous)
    for saved in (WEIGHTS, "context.safetensors"):
        assert (tmp_path / "cde" / saved).stat().st_mode & 0o777 == 0o644, saved
    _deny_reading(monkeypatch, tmp_path / "cde" / name)
    with pytest.raises(PermissionError, match=f"{name} cannot be read: permission denied"):
        ContextualSentenceTransformer(str(tmp_path / "cde"))
