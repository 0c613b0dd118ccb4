#!/usr/bin/env bash
# Writes summary.md for one results directory of bench/failover/run.sh and
# prints it. Usage: bench/failover/summarize.sh bench/failover/results/<stamp>
set -euo pipefail
out=${1:?usage: summarize.sh RESULTS_DIR}
cmd=$(cat "$out/command" 2>/dev/null || echo "bash bench/failover/run.sh")
{
  echo "# Failover benchmark $(basename "$out")"
  echo
  echo "Command (as root): \`$cmd\`"
  echo
  echo "Machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, kernel $(uname -r), $(go version 2>/dev/null | cut -d' ' -f3), keepalived $(keepalived --version 2>&1 | head -1 | awk '{print $2}')."
  echo "Outage = longest gap between answers on the VIP, probed every 10 ms from a client namespace."
  echo
  echo "| set | drill | runs | median ms | min ms | max ms | split brain | failed |"
  echo "|---|---|---|---|---|---|---|---|"
  for set in vigil vigil-tuned keepalived keepalived-tuned vigil-lease vigil-bgp vigil-ipv6 vigil-dual vigil-bgp-dual; do
    for d in kill-leader graceful partition-leader kill-etcd-leader kill-daemon mixed; do
      f="$out/$set-$d.json"
      [ -s "$f" ] || continue
      label=$set
      [ "$d" = mixed ] && label="$set (mixed run)"
      jq -r --arg set "$label" '.summary[] | "| \($set) | \(.drill) | \(.runs) | \(.medianMillis | round) | \(.minMillis | round) | \(.maxMillis | round) | \(.splitBrains) | \(.failed) |"' "$f"
    done
  done
  echo
  if compgen -G "$out/*ipv6*.json" >/dev/null || compgen -G "$out/*dual*.json" >/dev/null; then
    echo "Per family (labs with IPv6; skew = how far apart the two families switched to the new holder, resolution 10 ms):"
    echo
    echo "| file | drill | family | median ms | max ms | max skew ms |"
    echo "|---|---|---|---|---|---|"
    for f in "$out"/*ipv6*.json "$out"/*dual*.json; do
      [ -s "$f" ] || continue
      jq -r --arg set "$(basename "$f" .json)" '.summary[] | . as $s | .families[]? | "| \($set) | \($s.drill) | \(.family) | \(.medianMillis | round) | \(.maxMillis | round) | \($s.maxSkewMillis // 0 | round) |"' "$f"
    done
    echo
  fi
  echo "Split-brain details, if any:"
  for f in "$out"/*.json; do
    jq -r --arg f "$(basename "$f")" '.results[] | select(.splitBrain or .error) | "- \($f) run \(.run): \(.splitDetail // "") \(.error // "")"' "$f"
  done
  echo
  echo "Every run: the JSON files beside this one."
} > "$out/summary.md"
cat "$out/summary.md"
