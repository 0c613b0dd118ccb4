#!/usr/bin/env bash
# Summarizes a bench/gray results directory: one row per step, median and
# worst over the runs. Usage: bash bench/gray/summarize.sh DIR
set -euo pipefail
dir=$1
cat "$dir/command"
echo
echo "| fault | client outage, median (worst) | VIP moves, total | dual-holder samples, total | no holder, worst | least renewal margin, worst | back after heal, worst | etcd raft terms, total |"
echo "|---|---|---|---|---|---|---|---|"
jq -s -r '
  def median: sort | if length == 0 then null elif length % 2 == 1 then .[length/2|floor] else (.[length/2-1] + .[length/2]) / 2 end;
  def ms: if . == null then "-" else (. | round | tostring) + " ms" end;
  [.[][]] | group_by(.fault) | sort_by((.[0].lossPct // 0) > 0, .[0].latencyMillis // 0, .[0].lossPct // 0) | .[] |
  "| \(.[0].fault) | \([.[].outageMillis] | median | ms) (\([.[].outageMillis] | max | ms)) | \([.[].vipMoves] | add) | \([.[].dualSamples] | add) | \([.[].noHolderMillis] | max | ms) | \([.[].minMarginMillis | select(. >= 0)] | if length == 0 then "-" else (min | ms) end) | \([.[].backMillis] | max | ms) | \([.[].etcdTerms // empty] | if length == 0 then "-" else add end) |"
' "$dir"/run-*.json
