#!/usr/bin/env bash
# Run a GPU benchmark on an offline GPU machine, from the repository root there, with what benchmarks/gpu_prepare.sh
# packed in .gpu/: install the packed wheels into $SITE (default /tmp/site; the machine's own torch and CUDA stay),
# then run the step and write its results and log to $OUT (default: runs/gpu/, git-ignored).
#
#   bash benchmarks/gpu_run.sh env                    # what the machine has: GPU, driver, the packages that matter
#   bash benchmarks/gpu_run.sh first-light [ARGS...]  # benchmarks/speed/gpu_first_light.py --tokenizer .gpu/minilm
#   bash benchmarks/gpu_run.sh scale [ARGS...]        # benchmarks/quality/scale_run.py on the packed data and model
#   bash benchmarks/gpu_run.sh encode [ARGS...]       # benchmarks/speed/bench_encode_gpu.py: encode, encode_fast, the limit
#
# ARGS go to the script (e.g. `first-light --sections surrogate`, `scale --seed 7 --plan-steps T --stop-at-step S
# --no-zero-shot`); `scale` passes --seed 42 --budget-s 350 unless ARGS give them. Exit status 3: .gpu/minilm is not on
# this machine (copy bundle 1 first).
set -euo pipefail
cd "$(dirname "$0")/.."
step=${1:?usage: bash benchmarks/gpu_run.sh env|first-light|scale|encode [ARGS...]}
shift
export OUT=${OUT:-$PWD/runs/gpu}
site=${SITE:-/tmp/site}
mkdir -p "$OUT"
python=${PYTHON:-python3}

test -f .gpu/minilm/model.safetensors || { echo 'MISSING .gpu/minilm: copy bundle 1 to this machine first' >&2; exit 3; }
wheels=(.gpu/wheels_a/*.whl)
if [[ $step == scale ]]; then wheels+=(.gpu/wheels_b/*.whl); fi
"$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "${wheels[@]}"
export PYTHONPATH=$site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 CDE_ST_CACHE=$PWD/.gpu/cache

case $step in
  env)
    {
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || echo "nvidia-smi: not found"
      "$python" -m pip list 2>/dev/null | grep -iE '^(torch|transformers|sentence-transformers|datasets|pyarrow|fsspec|huggingface.hub|numpy|tokenizers|accelerate|faiss|flash) ' || true
      "$python" -c 'import cde_st, sentence_transformers as s; print("cde_st imports, sentence-transformers", s.__version__)'
    } 2>&1 | tee "$OUT/env.txt"
    ;;
  first-light)
    "$python" benchmarks/speed/gpu_first_light.py --out "$OUT" --tokenizer .gpu/minilm "$@" 2>&1 | tee "$OUT/first_light.log"
    ;;
  scale)
    defaults=()
    [[ " $* " == *" --seed "* ]] || defaults+=(--seed 42)
    [[ " $* " == *" --budget-s "* ]] || defaults+=(--budget-s 350)
    "$python" benchmarks/quality/scale_run.py --data .gpu/data/scale_data.tar.xz --model .gpu/minilm \
      --work /tmp/cde_st_scale_run "${defaults[@]}" "$@" --out "$OUT" 2>&1 | tee "$OUT/scale_run.log"
    ;;
  encode)
    "$python" benchmarks/speed/bench_encode_gpu.py --out "$OUT" --model .gpu/minilm --profile --budget-s 380 "$@" \
      2>&1 | tee "$OUT/bench_encode_gpu.log"
    ;;
  *)
    echo "unknown step '$step': env, first-light, scale or encode" >&2
    exit 2
    ;;
esac
echo "results in $OUT"
