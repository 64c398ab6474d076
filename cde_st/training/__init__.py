"""Training recipe: one config, presets, training pairs, and the SentenceTransformerTrainer wiring.

``train/train_cde.py`` and the ``cde-st-train`` command are thin over :func:`train`. Modules, in the order a run
uses them:

- :mod:`~cde_st.training.config`: :class:`TrainConfig` (every knob), config files, ``--set`` values and the presets
  (``presets/NAME.yaml``: commented files to read and copy); :mod:`~cde_st.coercion` converts values;
- :mod:`~cde_st.training.pairs`: the training pairs (``train_data``: jsonl files/folders, BEIR, hub, built-in);
- :mod:`~cde_st.training.tiny`: the tiny offline encoder of ``--preset tiny`` and the tests;
- :mod:`~cde_st.training.output_dir`: output folder, resume and overwrite rules;
- :mod:`~cde_st.training.checkpoints`: the checkpoints a run saved, whether one can be resumed from;
- :mod:`~cde_st.training.data_record`: the training files a run recorded (sizes, hashes), checked on resume;
- :mod:`~cde_st.training.interrupt`: SIGINT / SIGTERM stop a run at a step boundary, with a checkpoint to resume;
- :mod:`~cde_st.training.run`: model, loss, optimizer, sampler and evaluator, and :func:`train`.

    cfg = TrainConfig.from_preset("mini", train_data=["path/to/pairs"], output_dir="runs/mini-cde")
    model = train(cfg)
"""

from cde_st.training.checkpoints import CheckpointError, RunFinishedError, check_checkpoint
from cde_st.training.config import (
    PRESET_DIR,
    PRESET_TIMES,
    PRESETS,
    TrainConfig,
    TrainConfigError,
    config_yaml,
    default_output_dir,
    parse_set_items,
)
from cde_st.training.data_record import DATA_RECORD_FILE, ChangedDataError, data_record
from cde_st.training.interrupt import StopOnSignal, TrainingInterrupted, program_name, resume_command
from cde_st.training.output_dir import (
    LOCK_FILE,
    MANIFEST_FILE,
    RESUMABLE_FIELDS,
    OutputDirError,
    OutputDirInUseError,
    ResumeConfigError,
    prepare_output_dir,
    record_outputs,
    run_lock,
)
from cde_st.training.pairs import (
    TRAIN_DATA_HELP,
    NoTrainingDataError,
    TrainingDataError,
    load_pairs,
    tiny_pairs,
)
from cde_st.training.run import (
    MainProcessSavingTrainer,
    build_batch_sampler,
    build_evaluator,
    build_loss,
    build_model,
    build_optimizer,
    model_path,
    resolved_prompts,
    train,
)
from cde_st.training.tiny import build_tiny_encoder, build_tiny_tokenizer, tiny_vocab

__all__ = [
    "PRESETS",
    "PRESET_DIR",
    "PRESET_TIMES",
    "LOCK_FILE",
    "MANIFEST_FILE",
    "RESUMABLE_FIELDS",
    "CheckpointError",
    "ChangedDataError",
    "DATA_RECORD_FILE",
    "TRAIN_DATA_HELP",
    "MainProcessSavingTrainer",
    "NoTrainingDataError",
    "OutputDirError",
    "OutputDirInUseError",
    "ResumeConfigError",
    "RunFinishedError",
    "StopOnSignal",
    "TrainConfig",
    "TrainConfigError",
    "TrainingDataError",
    "TrainingInterrupted",
    "build_batch_sampler",
    "build_evaluator",
    "build_loss",
    "build_model",
    "build_optimizer",
    "build_tiny_encoder",
    "build_tiny_tokenizer",
    "check_checkpoint",
    "config_yaml",
    "data_record",
    "default_output_dir",
    "load_pairs",
    "model_path",
    "parse_set_items",
    "prepare_output_dir",
    "program_name",
    "record_outputs",
    "resolved_prompts",
    "resume_command",
    "run_lock",
    "tiny_pairs",
    "tiny_vocab",
    "train",
]
