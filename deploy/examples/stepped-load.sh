#!/usr/bin/env bash
# A stepped open-loop load for the example sidecar (deploy/examples/
# tokentap.yaml): requests are sent on a schedule, whatever the answers
# do, at each rate in turn, so that /slo's attainment-vs-load curve has
# points below, at and past the knee (docs/cost.md).
#
#   deploy/examples/stepped-load.sh [proxy-url]
#
# RATES (requests/s, default "1 3 5 7") and STEP_SECONDS (default 60) set
# the steps; the default run takes four minutes and sends about 960
# requests. It needs curl.
set -euo pipefail
url="${1:-http://127.0.0.1:8080}"
rates="${RATES:-1 3 5 7}"
step="${STEP_SECONDS:-60}"
body='{"model":"tokentap-sim","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"How far can this replica be loaded?"}]}'
for rate in $rates; do
  n=$((rate * step))
  gap=$(awk -v r="$rate" 'BEGIN { printf "%.4f", 1 / r }')
  echo "step: $rate requests/s for ${step}s ($n requests)" >&2
  for _ in $(seq "$n"); do
    curl -sS -N -o /dev/null --max-time 120 "$url/v1/chat/completions" \
      -H 'Content-Type: application/json' -d "$body" &
    sleep "$gap"
  done
done
wait
echo "done: see ${ADMIN:-http://127.0.0.1:9464}/slo" >&2
