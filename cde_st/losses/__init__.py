"""Training losses for contextual (and plain) embedding models."""

from cde_st.losses.filtered_infonce import FilteredInfoNCELoss, batch_context, false_negative_mask

__all__ = ["FilteredInfoNCELoss", "batch_context", "false_negative_mask"]
