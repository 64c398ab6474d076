#!/usr/bin/env bash
# The contextual model that starts as its bi-encoder (zero-initialised context gate), trained on
# partial and empty contexts (context_dropout), with cached or joint context attention, against the bi-encoder
# (c) of docs/experiment_log.md (names in its glossary)
# on the same data, batches, loss and seeds (preset `mini`, no prefixes).
# Usage: bash benchmarks/quality/context_gate_comparison.sh VARIANT SEED [eval-only]
#   VARIANT: dgc (gate + cached, residual output head, added params at lr 5e-3), dgc2 (gate + cached,
#   no output head, no first-stage MLP, added params at lr 2e-2), dgj (dgc2 with joint attention), dgc2u (the preset:
#   dgc2 with the context read in the top 3 of 6 layers, context_layers [3, 4, 5]), c (bi-encoder);
#   SEED: 42 (the preset's) or 1, 2
# Environment: SIZES="64" limits the J sweep; TAG=name and EXTRA="key=value ..." train a recipe variant
#   (e.g. TAG=no20ng EXTRA="exclude_domains=[scifact_train,twentynewsgroups]") into runs/mini-VARIANT-TAG-sSEED;
#   EXTRA takes any TrainConfig field (items split on whitespace, so no spaces inside a value), e.g.
#   cluster_size=1000000 (one cluster per domain) or, as an in-domain diagnostic (SciFact test is then in-domain),
#   train_data=[../shared/data/pairs/scifact_train.jsonl.gz] exclude_domains=[] max_pairs=null num_train_epochs=5.0
#   (docs/experiment_log.md, 2026-11-24, session 8);
#   TABLE2=1 also scores the five cheaper Table-2 tasks (docs/RESULTS.md: the six-task tables).
# Scores SciFact test NDCG@10 at max_seq_length 256 with J = 64, 0 and 16 (the context-size sweep).
set -euo pipefail
cd "$(dirname "$0")/../.."  # the repository root
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
variant=$1; seed=$2; name=$variant${TAG:+-$TAG}-s$seed; out=runs/mini-$name
read -r -a extra <<< "${EXTRA:-}"
GATE=(context_dropout=0.5 added_params_lr=0.005)
case $variant in
  dgc) settings=(model=contextual "model_config={context_gate: true, context_attention: cached}" "${GATE[@]}") ;;
  dgc2) settings=(model=contextual  # the preset's recipe of session 3: the context read in every layer
        "model_config={context_gate: true, context_attention: cached, output_head: none, first_stage_head: none}") ;;
  dgj) settings=(model=contextual  # dgc2 with joint attention
        "model_config={context_gate: true, context_attention: joint, output_head: none, first_stage_head: none}") ;;
  dgc2u) settings=(model=contextual) ;;  # the preset's own recipe since session 4: dgc2 read by the top 3 layers
  c) settings=(model=biencoder) ;;
  *) echo "unknown variant $variant" >&2; exit 2 ;;
esac
if [[ ${3:-} != eval-only ]]; then
  python train/train_cde.py --preset mini --output-dir "$out" --set seed="$seed" \
    "train_data=[../shared/data/pairs]" "${settings[@]}" \
    "query_prompt=''" "document_prompt=''" "${extra[@]}"
fi
sizes=(64 0 16); [[ $variant == c || $variant == dgj ]] && sizes=(64)
[[ -n ${SIZES:-} ]] && read -r -a sizes <<< "$SIZES"  # e.g. SIZES=64: only the J of the quality comparison
python eval/run_mteb.py --model "$out/final" --model-name "cde-st/mini-$name" --tasks scifact \
  --data-dir ../shared/data --prefixes off --max-seq-length 256 --batch-size 64 --context-size "${sizes[@]}" \
  --output-dir "runs/eval-gate/$name" --quiet
if [[ -n ${TABLE2:-} ]]; then
  context=(); [[ $variant != c ]] && context=(--context-size 64)
  python eval/run_mteb.py --model "$out/final" --model-name "cde-st/mini-$name" \
    --tasks stsbenchmark sickr biosses banking77 twentynewsgroups --data-dir ../shared/data --prefixes off \
    --max-seq-length 256 --batch-size 64 "${context[@]}" --output-dir "runs/eval-table2/$name" --quiet
fi
