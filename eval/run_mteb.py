"""Evaluate a CDE (or any sentence-transformers) model on MTEB tasks with per-task corpus context.

    python eval/run_mteb.py --model PATH_OR_NAME --tasks scifact stsbenchmark --data-dir ../shared/data
    python eval/run_mteb.py --model my-cde --tasks scifact --data-dir ../shared/data --context-size 0 16 64 256

Same as the ``cde-st-eval`` command; ``--help`` lists every option. The command line is cde_st.cli, the logic
cde_st.evaluation.
"""

import sys

from cde_st.cli import eval_run as main

if __name__ == "__main__":
    sys.exit(main())
