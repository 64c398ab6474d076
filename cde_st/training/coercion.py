"""The coercion rule of training configs: the one rule of every configuration entry point, which lives in
:mod:`cde_st.coercion` (``ContextualConfig`` uses it too, and cannot import the training package)."""

from cde_st.coercion import ConfigValueError, coerce, load_config_text, load_yaml_value, type_name

__all__ = ["ConfigValueError", "coerce", "load_config_text", "load_yaml_value", "type_name"]
