"""``python -m cde_st.serving MODEL ...``: the same as ``cde-st-serve`` (for environments without the script)."""

from cde_st.serving.serve_command import main

main()
