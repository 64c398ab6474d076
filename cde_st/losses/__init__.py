"""Training losses for contextual (and plain) embedding models.

- :mod:`~cde_st.losses.filtered_infonce`: :class:`FilteredInfoNCELoss`, the CDE training objective.
- :mod:`~cde_st.losses.false_negatives`: the guide's false-negative rule (:func:`false_negative_mask`).
- :mod:`~cde_st.losses.training_context`: the context of a training batch (:func:`batch_context`).
- :mod:`~cde_st.losses.gradient_cache`: running both stages, with two-stage gradient caching.
"""

from cde_st.losses.false_negatives import false_negative_mask
from cde_st.losses.filtered_infonce import FilteredInfoNCELoss
from cde_st.losses.training_context import batch_context

__all__ = ["FilteredInfoNCELoss", "batch_context", "false_negative_mask"]
