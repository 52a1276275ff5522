#!/usr/bin/env bash
# live-cost.sh: what an open live page costs the sidecar under load
# (docs/performance.md, "The live page under load"). The sidecar runs in
# front of its built-in simulator (the demo off), tools/soak keeps
# STREAMS streams in flight, and the sidecar's CPU per token event is
# measured over WINDOW-long windows, alternately with no browser and with
# one headless chromium open at /live (ROUNDS of each, interleaved, so
# that a drift of the machine's load hits both alike).
#
#   scripts/live-cost.sh                                # 500 streams, 3 rounds of 20 s windows
#   STREAMS=200 ROUNDS=5 WINDOW=30 scripts/live-cost.sh
#   PAGE='/live?n=1000' SIDECAR_FLAGS='--live.requests 1000' scripts/live-cost.sh  # the largest page
#
# CPU per event: the sidecar's user+system CPU time over the window
# (/proc/PID/stat) divided by the token events it timed in the window
# (the first tokens, gen_ai_server_time_to_first_token_seconds_count,
# plus the gaps, tokentap_inter_token_latency_seconds_count). Prints one
# line per window and the medians. Needs chromium (scripts/install-test-tools.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
STREAMS=${STREAMS:-500}
ROUNDS=${ROUNDS:-3}
WINDOW=${WINDOW:-20}
PAGE=${PAGE:-/live}
SIDECAR_FLAGS=${SIDECAR_FLAGS:-}
batch=$((STREAMS + 64))
command -v chromium >/dev/null || { echo "live-cost: chromium is not installed (scripts/install-test-tools.sh)" >&2; exit 2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/live-cost.XXXXXX")"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
go build -o "$work/sidecar" ./cmd/sidecar
go build -o "$work/soak" ./tools/soak
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
proxy="127.0.0.1:$(port)" admin="127.0.0.1:$(port)"
# shellcheck disable=SC2086
"$work/sidecar" --listen "$proxy" --admin-listen "$admin" --demo=off --energy off \
  --sim.max-batch $batch --sim.max-queue $((2 * batch)) --sim.error-prob 0 --sim.stall-prob 0 --sim.max-tokens 64 \
  --sim.decode-base 20ms --sim.decode-per-seq 0s --sim.prefill-base 2ms --sim.prefill-per-token 1us --sim.eos-prob 0.01 \
  $SIDECAR_FLAGS >"$work/sidecar.log" 2>&1 &
sidecar=$!
pids+=("$sidecar")
for _ in $(seq 100); do curl -sf "http://$admin/healthz" >/dev/null && break; sleep 0.1; done
total=$(( (2 * ROUNDS) * WINDOW + 10 * ROUNDS + 60 )) # the windows, each browser's start, the warm-up, slack
"$work/soak" -url "http://$proxy" -streams "$STREAMS" -duration "${total}s" -model tokentap-sim -report 0 >"$work/soak.log" 2>&1 &
pids+=("$!")
sleep 10 # warm-up: every stream in flight

ticks() { awk '{ print $14 + $15 }' "/proc/$sidecar/stat"; }
events() {
  curl -sf "http://$admin/metrics" | awk '
    /^gen_ai_server_time_to_first_token_seconds_count|^tokentap_inter_token_latency_seconds_count/ { n += $NF }
    END { printf "%.0f\n", n }'
}
hz=$(getconf CLK_TCK)
window() { # LABEL: one window; prints µs of CPU per event
  local c0 e0 c1 e1
  c0=$(ticks) e0=$(events)
  sleep "$WINDOW"
  c1=$(ticks) e1=$(events)
  awk -v l="$1" -v c=$((c1 - c0)) -v e=$((e1 - e0)) -v hz="$hz" -v w="$WINDOW" 'BEGIN {
    printf "%-8s %8.0f events/s  %6.2f CPU  %6.2f µs CPU per event\n", l, e / w, c / hz / w, c / hz / e * 1e6 > "/dev/stderr"
    printf "%.3f\n", c / hz / e * 1e6 }'
}
off=() on=()
for _ in $(seq "$ROUNDS"); do
  off+=("$(window none)")
  chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --user-data-dir="$work/chromium" \
    "http://$admin$PAGE" >"$work/chromium.log" 2>&1 &
  browser=$!
  pids+=("$browser")
  sleep 3 # the page loads and starts polling
  on+=("$(window browser)")
  kill "$browser" 2>/dev/null || true
  wait "$browser" 2>/dev/null || true
  polls=$(curl -sf "http://$admin/metrics" | awk '/^tokentap_live_polls_total/ { n += $NF } END { print n + 0 }')
  echo "         (polls of /live/data so far: $polls)" >&2
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
m0=$(median "${off[@]}") m1=$(median "${on[@]}")
echo "live-cost: $STREAMS streams, $ROUNDS rounds of $WINDOW s, page $PAGE"
echo "live-cost: median CPU per event: no browser $m0 µs, one browser at the live page $m1 µs ($(awk -v a="$m0" -v b="$m1" 'BEGIN { printf "%+.1f%%", (b / a - 1) * 100 }'))"
