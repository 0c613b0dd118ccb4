#!/usr/bin/env bash
# Summarizes bench/lb results: median and worst over every round of every run.
set -euo pipefail
out=$1
jq -s -r '
  def median: sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  def r1: . * 10 | round / 10;
  [.[].loads[]] as $loads
  | [.[].ejections[]?] as $ej
  | "# Load balancer benchmark\n",
    "Every figure is over \($loads | map(select(.target == "vigil" and .mode == "rtt")) | length) rounds.\n",
    "| target | rtt p50 µs (worst) | rtt p99 µs (worst) | connect p50 µs (worst) | connect p99 µs (worst) | conns/s median (worst) | MiB/s median (worst) |",
    "|---|---|---|---|---|---|---|",
    ( ["direct", "vigil", "haproxy"][] as $t
      | ($loads | map(select(.target == $t))) as $l
      | ($l | map(select(.mode == "rtt"))) as $rtt
      | ($l | map(select(.mode == "connect"))) as $con
      | ($l | map(select(.mode == "conns"))) as $cps
      | ($l | map(select(.mode == "throughput"))) as $thr
      | "| \($t) | \($rtt | map(.p50us) | median | r1) (\($rtt | map(.p50us) | max | r1)) | \($rtt | map(.p99us) | median | r1) (\($rtt | map(.p99us) | max | r1)) | \($con | map(.p50us) | median | r1) (\($con | map(.p50us) | max | r1)) | \($con | map(.p99us) | median | r1) (\($con | map(.p99us) | max | r1)) | \($cps | map(.perSecond) | median | round) (\($cps | map(.perSecond) | min | round)) | \($thr | map(.perSecond) | median | round) (\($thr | map(.perSecond) | min | round)) |"),
    ( if ($ej | length) == 0 then empty else
      "",
      "Ejection of a SIGKILLed backend, while one client connects in a loop through each balancer:\n",
      "| balancer | median ms | worst ms | client errors (all ejections) |",
      "|---|---|---|---|",
      "| vigil | \($ej | map(.vigilMillis) | median | round) | \($ej | map(.vigilMillis) | max | round) | \($ej | map(.vigilClientErrors) | add) of \($ej | map(.vigilConns) | add) |",
      "| haproxy | \($ej | map(.haproxyMillis) | median | round) | \($ej | map(.haproxyMillis) | max | round) | \($ej | map(.haproxyClientErrors) | add) of \($ej | map(.haproxyConns) | add) |"
      end ),
    ( [.[].flood | select(. != null)] as $fl
      | if ($fl | length) == 0 then empty else
        "",
        "Flood through vigil: connection attempts from the source addresses in the command (FLOOD_SOURCES, 10.250.0.3 onward; each attempt sends a byte, then nothing), while another client keeps connecting from its own:\n",
        "| run | attempts | per second | held to the end | reset | dial errors | other client: connections, errors | other p50 / p99 µs | VIP not only on the holder (samples) | holder RSS before -> max MiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
        ( $fl | to_entries[] | .key as $i | .value
          | "| \($i + 1) | \(.flood.count) | \(.flood.perSecond | round) | \(.flood.held // 0) | \(.flood.refused // 0) | \(.flood.errors) | \(.other.count), \(.other.errors) | \(.other.p50us | r1) / \(.other.p99us | r1) | \(.notOnHolder) of \(.vipSamples) | \(.holderRSSBeforeMiB | r1) -> \(.holderRSSMiB | r1) |" )
      end )
' "$out"/run-*.json > "$out/summary.md"
{ echo; echo "Command: \`$(cat "$out/command")\`"; echo; echo "Machine: $(tr '\n' ' ' < "$out/machine")"; } >> "$out/summary.md"
cat "$out/summary.md"
