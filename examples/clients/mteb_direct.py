"""mteb used directly: mteb.evaluate on a tiny local retrieval task (BEIR layout, written to a temp folder).

mteb caches results by model name and revision (a local folder is "no_model_name/available"): name the run after
the context it used, or a run with another context returns the cached scores without encoding anything.
mteb applies the model's "query"/"document" prompts by prompt type; the context is the one set on the model.
"""

import json
import os
import tempfile
from pathlib import Path

tmp = Path(tempfile.mkdtemp())
os.environ.setdefault("MTEB_CACHE", str(tmp / "mteb_cache"))  # before importing mteb
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import mteb  # noqa: E402
from _common import CORPUS, QUERIES, load_model  # noqa: E402

from cde_st.evaluation.local_tasks import load_local_task  # noqa: E402

folder = tmp / "tiny_retrieval"
(folder / "qrels").mkdir(parents=True)
(folder / "corpus.jsonl").write_text(
    "".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(CORPUS))
)
(folder / "queries.jsonl").write_text(
    "".join(json.dumps({"_id": f"q{i}", "text": t}) + "\n" for i, t in enumerate(QUERIES))
)
(folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td1\t1\nq1\td0\t1\n")
task = load_local_task(folder, name="TinyRetrieval")

model = load_model()
info = model.set_context(CORPUS, seed=0)  # retrieval: the context comes from the corpus, never the queries
model.model_card_data.model_name = f"local/my-cde-ctx{info.size}-seed{info.seed}"
model.model_card_data.base_model_revision = info.fingerprint  # mteb's "revision": one result file per context

results = mteb.evaluate(model, tasks=[task], cache=mteb.ResultCache(os.environ["MTEB_CACHE"]))
for result in results.task_results:
    print(result.task_name, round(result.get_score(), 4))
