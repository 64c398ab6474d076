"""One training run: build the model, loss, optimizer, batch sampler and evaluator of a :class:`TrainConfig`, and
train them with sentence-transformers' trainer (:func:`train`).

The same function trains a contextual model, or a plain bi-encoder baseline (``model: biencoder``) with identical
data, batching and loss. ``cde-st-train`` and ``train/train_cde.py`` are thin over it.

    cfg = TrainConfig.from_preset("tiny", output_dir="runs/tiny")
    model = train(cfg)
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.base.modules import Module, Transformer
from sentence_transformers.base.sampler import BatchSamplers
from sentence_transformers.sentence_transformer.evaluation import SentenceEvaluator
from sentence_transformers.sentence_transformer.modules import Pooling
from sentence_transformers.util import fullname
from transformers import TrainerCallback

from cde_st.batching import ClusteredBatchSampler
from cde_st.data import column
from cde_st.defaults import default_surrogate_model_path, load_default_surrogate
from cde_st.evaluation.evaluators import ContextualRetrievalEvaluator, with_corpus_context
from cde_st.losses import FilteredInfoNCELoss
from cde_st.model import ContextualSentenceTransformer, contextual_module, is_contextual
from cde_st.prompts import DOCUMENT_PROMPT, QUERY_PROMPT
from cde_st.training.checkpoints import CheckpointError, checkpoints, refuse_to_resume_a_finished_run
from cde_st.training.config import TrainConfig
from cde_st.training.interrupt import StopOnSignal, TrainingInterrupted
from cde_st.training.output_dir import prepare_output_dir, record_outputs, run_lock
from cde_st.training.pairs import TRAIN_DATA_HELP, NoTrainingDataError, load_pairs, pairs_for_max_steps
from cde_st.training.tiny import build_tiny_encoder

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------- models
def model_path(name: str | None, cfg: TrainConfig) -> str | None:
    """The folder or hub id a config's model name stands for: "minilm" is the offline all-MiniLM-L6-v2, "tiny" the
    run's tiny random encoder (built once in ``output_dir/_tiny_base``); anything else is itself."""
    if name == "minilm":
        return default_surrogate_model_path()
    if name == "tiny":
        return build_tiny_encoder(os.path.join(cfg.output_dir, "_tiny_base"), seed=cfg.seed)
    return name


def _base_model_path(cfg: TrainConfig) -> str:
    return model_path(cfg.base_model, cfg)


def resolved_prompts(cfg: TrainConfig) -> dict[str, str]:
    """The query and document prompts of the run: the configured ones, else the CDE prompts for a contextual model
    and none for a bi-encoder."""
    contextual = cfg.model == "contextual" or (cfg.model == "continue" and _is_cde_folder(cfg.init_from))
    query = cfg.query_prompt if cfg.query_prompt is not None else (QUERY_PROMPT if contextual else "")
    document = cfg.document_prompt if cfg.document_prompt is not None else (DOCUMENT_PROMPT if contextual else "")
    return {"query": query, "document": document}


def _is_cde_folder(path: str | None) -> bool:
    return bool(path) and os.path.exists(os.path.join(path, "cde_config.json"))


def build_model(cfg: TrainConfig) -> SentenceTransformer:
    """A new contextual model, a plain bi-encoder, or a saved model to continue from."""
    prompts = resolved_prompts(cfg)
    if cfg.model == "continue":
        if not cfg.init_from or not os.path.exists(cfg.init_from):
            raise FileNotFoundError(f"model=continue needs an existing init_from folder, got {cfg.init_from!r}.")
        if _is_cde_folder(cfg.init_from):
            return ContextualSentenceTransformer(cfg.init_from)
        return SentenceTransformer(cfg.init_from)
    path = _base_model_path(cfg)
    if cfg.model == "contextual":
        return ContextualSentenceTransformer.from_encoder(
            path,
            context_size=cfg.context_size,
            max_seq_length=cfg.max_seq_length,
            query_prompt=prompts["query"],
            document_prompt=prompts["document"],
            **cfg.model_config,
        )
    if cfg.model == "biencoder":
        if os.path.exists(os.path.join(path, "modules.json")):
            model = SentenceTransformer(path)
        else:
            transformer = Transformer(path, max_seq_length=cfg.max_seq_length)
            model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")])
        model.max_seq_length = cfg.max_seq_length
        model.prompts = {**model.prompts, **prompts}
        return model
    raise ValueError(f"model must be 'contextual', 'biencoder' or 'continue', got {cfg.model!r}.")


# ------------------------------------------------------------------------------------------- loss, batches, ...
def use_bf16(cfg: TrainConfig) -> bool:
    """Whether the run trains in bf16: the config's ``bf16``, where ``"auto"`` means a CUDA device that supports it."""
    if cfg.bf16 == "auto":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return bool(cfg.bf16)


def build_loss(cfg: TrainConfig, model: SentenceTransformer) -> FilteredInfoNCELoss:
    """The run's :class:`~cde_st.losses.FilteredInfoNCELoss`, with its guide model when false negatives are filtered."""
    guide = None
    if cfg.filter_false_negatives:
        if cfg.guide is None:
            guide = load_default_surrogate()
        else:
            guide = SentenceTransformer(model_path(cfg.guide, cfg))
    return FilteredInfoNCELoss(
        model,
        guide=guide,
        temperature=cfg.temperature,
        margin=cfg.margin,
        mini_batch_size=cfg.mini_batch_size,
        context_mini_batch_size=cfg.context_mini_batch_size,
        bidirectional=cfg.bidirectional,
        filter_false_negatives=cfg.filter_false_negatives,
        context_dropout=cfg.context_dropout,
        gather_across_devices=cfg.gather_across_devices,
        leave_one_out=cfg.leave_one_out,
    )


def build_optimizer(cfg: TrainConfig, model: SentenceTransformer) -> torch.optim.Optimizer:
    """AdamW with the trainer's defaults, weight decay off for biases, norms and context gates, and the
    parameters cde_st adds to the pretrained encoders (context gates, heads, null vector, soft prompt) at
    ``added_params_lr``: they start at zero or at random, so they may want a larger step than the encoders."""
    added, no_decay = set(), set()
    if cfg.model != "biencoder":
        if is_contextual(model):
            module = contextual_module(model)
            added = {id(p) for _, p in module.added_parameters()}
            if module.gates is not None:
                no_decay.add(id(module.gates))  # decay would pull the gates shut
    groups: dict[tuple[bool, bool], list] = {}
    for param in model.parameters():
        if param.requires_grad:
            decay = param.ndim >= 2 and id(param) not in no_decay
            groups.setdefault((id(param) in added, decay), []).append(param)
    return torch.optim.AdamW(
        [
            {
                "params": params,
                "lr": cfg.learning_rate if not is_added or cfg.added_params_lr is None else cfg.added_params_lr,
                "weight_decay": cfg.weight_decay if decay else 0.0,
            }
            for (is_added, decay), params in sorted(groups.items())
        ],
        lr=cfg.learning_rate,
    )


def build_batch_sampler(cfg: TrainConfig, pairs: Dataset) -> BatchSamplers | partial:
    """What the trainer batches with: the clustered sampler (options bound; the trainer adds the dataset), or
    sentence-transformers' random batches without duplicates."""
    if cfg.batching == "random":
        return BatchSamplers.NO_DUPLICATES
    if cfg.batching != "clustered":
        raise ValueError(f"batching must be 'clustered' or 'random', got {cfg.batching!r}.")
    return partial(
        ClusteredBatchSampler,
        cluster_size=min(cfg.batch_size if cfg.cluster_size is None else cfg.cluster_size, len(pairs)),
        surrogate=model_path(cfg.surrogate, cfg),
        surrogate_kind=cfg.surrogate_kind,
        domains=column(pairs, "domain"),  # a plain list: the trainer pickles these options into every checkpoint
        query_column="query",
        document_column="document",
        max_seq_length=cfg.max_seq_length,  # the surrogate sees what the model sees (and it is much faster)
    )


def build_evaluator(cfg: TrainConfig) -> ContextualRetrievalEvaluator | None:
    """The in-training evaluator of ``cfg.eval_folder``: a :class:`~cde_st.evaluation.evaluators.ContextualRetrievalEvaluator`,
    which scores a contextual model with the model's J documents of the evaluated corpus as context (a stock
    ``InformationRetrievalEvaluator`` would score the null context, a plain bi-encoder)."""
    if not cfg.eval_folder:
        return None
    return ContextualRetrievalEvaluator(
        cfg.eval_folder,
        split=cfg.eval_split,
        max_corpus=cfg.eval_max_corpus,
        seed=cfg.seed,
        name=Path(cfg.eval_folder).name,
    )


# ----------------------------------------------------------------------------------------------------- the run
class MainProcessSavingTrainer(SentenceTransformerTrainer):
    """SentenceTransformerTrainer whose checkpoints only the main process writes. transformers moved that guard into
    ``Trainer._save``, which sentence-transformers 6.2 overrides without it: under torchrun every rank wrote the
    same checkpoint files at once."""

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        if self.args.should_save:
            super()._save(output_dir, state_dict=state_dict)

    def _load_from_checkpoint(self, checkpoint_path: str) -> None:
        """The checkpoint's weights into the model, as sentence-transformers loads them (a fresh model from the
        checkpoint folder, its state dict copied over), except that parameters the fresh load adds and the trained
        model lacks are left out: the checkpoint folder does not keep the loading options the model was built with
        (the tiny encoder loads without BERT's pooler), so the fresh load builds them newly initialised."""
        model = getattr(self.model, "_orig_mod", self.model)
        module_classes = {fullname(module): type(module) for module in model.modules() if isinstance(module, Module)}
        loaded = model.__class__._load_with_module_classes(
            checkpoint_path, module_classes, trust_remote_code=model.trust_remote_code
        )
        state, own = loaded.state_dict(), model.state_dict()
        missing = sorted(set(own) - set(state))
        if missing:
            raise CheckpointError(
                f"Cannot resume: checkpoint {checkpoint_path} lacks weights of the model ({missing[:4]}...): it was "
                "saved from another model. Resume from a checkpoint of this run."
            )
        model.load_state_dict({key: state[key] for key in own})


class _RecordCheckpoints(TrainerCallback):
    """Lists each checkpoint in the output folder's manifest as the trainer is about to write it, so that
    ``--overwrite-output-dir`` may later remove it (and nothing it did not write)."""

    def __init__(self, output_dir: str) -> None:
        self.output_dir = output_dir

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_save and state.is_world_process_zero:
            record_outputs(self.output_dir, f"checkpoint-{state.global_step}")

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            record_outputs(self.output_dir, f"checkpoint-{state.global_step}")


def _warn_if_nothing_was_learned(trainer: SentenceTransformerTrainer, cfg: TrainConfig) -> None:
    """A warning when every logged training loss was 0: the loss had nothing to tell apart (e.g. every in-batch
    negative filtered as a false negative, or batches of one pair), so the run changed nothing."""
    losses = [entry["loss"] for entry in trainer.state.log_history if isinstance(entry.get("loss"), (int, float))]
    if losses and all(math.isfinite(v) and abs(v) < 1e-12 for v in losses):
        logger.warning(
            "The training loss was 0 at every logged step (%d): the model learned nothing from %s. Each query's "
            "document was the only candidate left in its batch: check that the pairs differ from each other and "
            "that filter_false_negatives (margin %s) does not drop every negative.",
            len(losses),
            cfg.train_data,
            cfg.margin,
        )


def train(
    cfg: TrainConfig,
    resume: bool | str = False,
    overwrite_output_dir: bool = False,
    allow_config_change: bool = False,
    evaluator: SentenceEvaluator | None = None,
    allow_changed_data: bool = False,
) -> SentenceTransformer:
    """Train as configured; save the final model (with its model card) to ``output_dir/final``; return it.

    ``resume``: continue from the last checkpoint in ``output_dir`` (or from the given checkpoint folder);
    ``overwrite_output_dir``: replace an earlier run in ``output_dir``; ``allow_config_change``: resume although
    the config differs from the checkpoints' (see :func:`prepare_output_dir`); ``allow_changed_data``: resume
    although the training files changed since the run recorded them (:mod:`~cde_st.training.data_record`).
    ``evaluator``: a sentence-transformers evaluator to use instead of ``eval_folder``'s; for a contextual model it
    goes through :func:`cde_st.evaluation.evaluators.with_corpus_context` (a stock ``InformationRetrievalEvaluator``
    gets its own corpus as context, other evaluators must come wrapped in
    :class:`~cde_st.evaluation.evaluators.ContextualEvaluator`).

    The output folder belongs to this run while it trains (:func:`~cde_st.training.output_dir.run_lock`): a second
    run into it is refused, naming this one. SIGINT (Ctrl-C) or SIGTERM stops the run at the end of its step, with a
    checkpoint to resume from (:class:`~cde_st.training.interrupt.TrainingInterrupted`)."""
    if not cfg.train_data:
        raise NoTrainingDataError(f"the training config has no training data: set train_data to {TRAIN_DATA_HELP}.")
    if evaluator is not None and cfg.eval_folder:
        raise ValueError(
            f"Give either eval_folder ({cfg.eval_folder!r}) or an evaluator ({type(evaluator).__name__}), not both."
        )
    # Under torchrun / accelerate launch every rank runs this function; only rank 0 touches the output folder.
    is_main = int(os.environ.get("RANK", "0")) == 0
    stop = StopOnSignal()
    try:
        with stop, run_lock(cfg.output_dir) if is_main else contextlib.nullcontext():
            resuming = (resume, overwrite_output_dir, allow_config_change, allow_changed_data)
            return _train(cfg, resuming, evaluator, is_main, stop)
    except TrainingInterrupted as interrupted:  # the lock is released by now
        interrupted.locate_checkpoint(cfg.output_dir)
        raise


def _train(
    cfg: TrainConfig,
    resuming: tuple[bool | str, bool, bool, bool],
    evaluator: SentenceEvaluator | None,
    is_main: bool,
    stop: StopOnSignal,
) -> SentenceTransformer:
    """``resuming``: ``resume``, ``overwrite_output_dir``, ``allow_config_change`` and ``allow_changed_data``."""
    torch.manual_seed(cfg.seed)
    resume = resuming[0]
    if is_main:
        prepare_output_dir(cfg, *resuming)
    elif resume and (isinstance(resume, str) or checkpoints(cfg.output_dir)):
        # The other ranks stop with rank 0 on a finished run instead of waiting for it in the first collective.
        checkpoint = (
            resume if isinstance(resume, str) else os.path.join(cfg.output_dir, checkpoints(cfg.output_dir)[-1])
        )
        refuse_to_resume_a_finished_run(cfg, checkpoint)

    pairs = load_pairs(cfg)
    # Only what max_steps trains on is embedded and clustered (all ranks draw the same seeded sample).
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    pairs = pairs_for_max_steps(pairs, cfg.max_steps, cfg.batch_size, processes, seed=cfg.seed)
    train_dataset = pairs.remove_columns("domain")  # the collator would feed any extra column to the model
    model = build_model(cfg)
    loss = build_loss(cfg, model)
    # A contextual model must never be scored (and its best checkpoint chosen) with the null context.
    evaluator = with_corpus_context(evaluator or build_evaluator(cfg), model, seed=cfg.seed)
    args = training_arguments(cfg, pairs, evaluator)
    if args.world_size > 1:
        logger.info(
            "data-parallel training on %d processes (%s): %d pairs per rank and step, %d in all",
            args.world_size,
            args.parallel_mode.value,
            cfg.batch_size,
            cfg.batch_size * args.world_size,
        )
    trainer = MainProcessSavingTrainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        loss=loss,
        evaluator=evaluator,
        optimizers=(build_optimizer(cfg, model), None),  # the trainer adds its linear warm-up schedule
    )
    trainer.add_callback(stop)  # before _RecordCheckpoints, which lists the checkpoint a stop asks for
    trainer.add_callback(_RecordCheckpoints(cfg.output_dir))
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume or None)
    wall = time.perf_counter() - start
    if stop.stopped:
        raise TrainingInterrupted(stop.signum or signal.SIGTERM, step=trainer.state.global_step)
    if not trainer.is_world_process_zero():
        return model
    _warn_if_nothing_was_learned(trainer, cfg)
    _save_final(cfg, model, evaluator, wall, trainer.state.global_step, len(pairs), args.world_size)
    return model


def training_arguments(
    cfg: TrainConfig,
    pairs: Dataset,
    evaluator: SentenceEvaluator | None,
    batch_sampler: Any = None,
    **overrides: Any,
) -> SentenceTransformerTrainingArguments:
    """The trainer's arguments: the config's optimisation, saving and logging fields, and the batch sampler
    (``batch_sampler``, else :func:`build_batch_sampler` of the config). ``overrides``: other
    ``SentenceTransformerTrainingArguments`` values, over these (a driver that saves nothing, say)."""
    prompts = resolved_prompts(cfg)
    fields = dict(
        output_dir=cfg.output_dir,
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate,
        warmup_steps=cfg.warmup_steps,
        lr_scheduler_type="linear",
        num_train_epochs=cfg.num_train_epochs,
        max_steps=cfg.max_steps,
        weight_decay=cfg.weight_decay,
        bf16=use_bf16(cfg),
        seed=cfg.seed,
        batch_sampler=build_batch_sampler(cfg, pairs) if batch_sampler is None else batch_sampler,
        prompts={"query": prompts["query"], "document": prompts["document"]} if any(prompts.values()) else None,
        eval_strategy="steps" if (evaluator is not None and cfg.eval_steps) else "no",
        eval_steps=cfg.eval_steps,
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        logging_steps=cfg.logging_steps,
        dataloader_num_workers=cfg.dataloader_num_workers,
        dataloader_drop_last=False,
        dataloader_pin_memory=torch.cuda.is_available(),
        # Without CUDA, a launcher's processes must be told they train on the CPU (accelerate then runs them
        # data-parallel over gloo); otherwise the process group stays idle and every process trains alone.
        use_cpu=not torch.cuda.is_available(),
        report_to="none",
    )
    return SentenceTransformerTrainingArguments(**{**fields, **overrides})


def _save_final(
    cfg: TrainConfig,
    model: SentenceTransformer,
    evaluator: SentenceEvaluator | None,
    wall: float,
    steps: int,
    pairs: int,
    processes: int,
) -> None:
    """The final model to ``output_dir/final``, then ``train_summary.json`` (with the final evaluation, if any)."""
    final_dir = os.path.join(cfg.output_dir, "final")
    record_outputs(cfg.output_dir, "final", "train_summary.json")
    model.save(final_dir)
    summary = {"train_wall_seconds": round(wall, 1), "steps": steps, "pairs": pairs, "processes": processes}
    if evaluator is not None:
        summary["final_eval"] = evaluator(model)
    with open(os.path.join(cfg.output_dir, "train_summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    logger.info("training done: %s", summary)
