#!/usr/bin/env bash
# Writes summary.md for a results directory of bench/chaos/run.sh: one table
# per set, a row per fault kind.
# Usage: bash bench/chaos/summarize.sh bench/chaos/results/<stamp>
set -euo pipefail
dir=${1:?usage: summarize.sh RESULTS_DIR}
{
  for f in "$dir"/*.json; do
    set=$(basename "$f" .json)
    jq -r --arg set "$set" '
      "## \($set): \(.faults | length) faults in \(.durationSeconds | floor) s, seed \(.seed)\n",
      "| fault | count | outage median ms | outage worst ms | no holder median ms | no holder worst ms | dual-holder samples | worst dual-holder time ms | failed |",
      "|---|---|---|---|---|---|---|---|---|",
      (.summary[] | "| \(.kind) | \(.count) | \(.outageMedianMillis | round) | \(.outageWorstMillis | round) | \(.noHolderMedianMillis | round) | \(.noHolderWorstMillis | round) | \(.dualSamples) | \(.dualWorstMillis | round) | \(.failed) |"),
      "",
      "Faults that broke an invariant: \([.faults[] | select((.violations // []) | length > 0)] | length).",
      "Stray VIP lifetime: worst \([.faults[] | select(.kind == "stray-vip") | .strayGoneMillis] | max // "n/a") ms.",
      "Thawed node kept the VIP: worst \([.faults[] | select(.kind == "freeze" and .thawDropMillis >= 0) | .thawDropMillis] | max // "n/a") ms, over \([.faults[] | select(.kind == "freeze" and .thawDropMillis >= 0)] | length) thaws with the VIP still on.",
      ""' "$f"
  done
} > "$dir/summary.md"
echo "wrote $dir/summary.md"
