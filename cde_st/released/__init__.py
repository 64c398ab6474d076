"""The released CDE checkpoints (``jxm/cde-small-v1``, ``jxm/cde-small-v2``) as native cde_st modules.

A released repo holds a ``config.json`` with the CDE fields (``transductive_corpus_size``, ``embedder``, ...) and a
``model.safetensors`` with the research code's parameter names; it ships no backbone config and no tokenizer (the
remote code fetched both from the ``embedder`` repo at construction time). :func:`load_released` reads those files
(local folder, or the Hugging Face cache/download), builds a :class:`~cde_st.modules.ContextualTransformer` in its
released-compatible mode and maps the weights into it. No remote code runs.

What each release does differently, and which fields reproduce it (see the parity fixture's README):

============================  =====================================  =====================================
fact                          cde-small-v1 (NomicBERT)               cde-small-v2 (ModernBERT)
============================  =====================================  =====================================
soft prompt                   8 vectors after the context            8 vectors after the context
rotary positions              text/prompt count along the joint      every row counts along the joint
                              sequence; context rows unrotated       sequence (context order matters)
joint sequence re-embedded    text gets token_type[0] twice          text is LayerNormed twice
sliding-window layers         (none)                                 window over the joint sequence
pooling                       all text tokens                        skips the instruction up to ": "
output head                   Linear-ReLU-Linear                     the same plus a residual
============================  =====================================  =====================================

cde-small-v1 and rotary: the research repository's ``hf_model.py`` rotates queries and keys along the *head* axis,
so its rotation cancels in q.k and that file has no positions at all. NomicBERT's own code and the CDE training
code rotate along the sequence, which is what the model was trained with; cde_st implements the sequence rotation
(the fixture's ``counterfactual_seq_rotary`` outputs), not the bug.

Where each part lives: ``hub.py`` (recognising a released model, fetching its files), ``configs.py`` (the backbone
config and its checks, the :class:`ContextualConfig` of a release), ``weights.py`` (the parameter names),
``loading.py`` (:func:`load_released`).
"""

from cde_st.released.configs import BACKBONE_CONFIGS, backbone_config, check_backbone_config, module_config
from cde_st.released.hub import (
    ALIASES,
    BACKBONE_CONFIG_FILE,
    CONFIG_FILE,
    PROMPTS,
    WEIGHTS_FILE,
    ReleasedCheckpointError,
    is_released_checkpoint,
    is_released_config,
    offline_hub_problem,
    resolve_name,
)
from cde_st.released.loading import load_released
from cde_st.released.weights import convert_state_dict

__all__ = [
    "ALIASES",
    "BACKBONE_CONFIGS",
    "BACKBONE_CONFIG_FILE",
    "CONFIG_FILE",
    "PROMPTS",
    "WEIGHTS_FILE",
    "ReleasedCheckpointError",
    "backbone_config",
    "check_backbone_config",
    "convert_state_dict",
    "is_released_checkpoint",
    "is_released_config",
    "load_released",
    "module_config",
    "offline_hub_problem",
    "resolve_name",
]
