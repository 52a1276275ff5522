#!/usr/bin/env bash
# soak.sh: a long, bounded load against the real sidecar binary, with its
# resident memory, goroutines and open descriptors printed after the
# warm-up and at the end. Not part of CI's default path (scripts/test.sh);
# run it by hand before a release or after a change to the data path.
#
#   scripts/soak.sh                          # 500 streams for 10 minutes, built-in simulator
#   DURATION=60s STREAMS=100 scripts/soak.sh # a short run
#   UPSTREAM=http://127.0.0.1:8000 MODEL=my-model scripts/soak.sh
#
# Environment:
#   DURATION    how long the load runs after the warm-up (default 10m)
#   STREAMS     concurrent streams kept in flight (default 500)
#   WARMUP      load before the first figures are taken (default 15s)
#   UPSTREAM    engine URL; empty: the sidecar's built-in simulator
#   MODEL       model name sent (default: the simulator's, tokentap-sim)
#   MAX_TOKENS  max_tokens of every request (default 64)
#   SIM_FLAGS   simulator flags (default: fast, no errors, no stalls,
#               batch and queue large enough for STREAMS)
#   SIDECAR_FLAGS  more sidecar flags
#
# Everything listens on 127.0.0.1. The sidecar is stopped at the end (and
# on Ctrl-C); its log and records file are kept in the work directory it
# prints. Exit status: non-zero when the load generator saw too many
# errors (tools/soak -max-error-ratio) or the sidecar died.
set -euo pipefail

cd "$(dirname "$0")/.."
DURATION=${DURATION:-10m}
STREAMS=${STREAMS:-500}
WARMUP=${WARMUP:-15s}
UPSTREAM=${UPSTREAM:-}
MODEL=${MODEL:-tokentap-sim}
MAX_TOKENS=${MAX_TOKENS:-64}
batch=$((STREAMS + 64))
SIM_FLAGS=${SIM_FLAGS:---sim.max-batch $batch --sim.max-queue $((2 * batch)) --sim.error-prob 0 --sim.stall-prob 0 --sim.max-tokens $MAX_TOKENS --sim.decode-base 20ms --sim.decode-per-seq 0s --sim.prefill-base 2ms --sim.prefill-per-token 1us --sim.eos-prob 0.01}
SIDECAR_FLAGS=${SIDECAR_FLAGS:-}

secs() { # a Go-style duration (90s, 10m, 1h) in whole seconds
	local d=$1
	case $d in
	*h) echo $((${d%h} * 3600)) ;;
	*m) echo $((${d%m} * 60)) ;;
	*s) echo "${d%s}" ;;
	*) echo "$d" ;;
	esac
}
dur_s=$(secs "$DURATION")
warm_s=$(secs "$WARMUP")

work=$(mktemp -d "${TMPDIR:-/tmp}/tokentap-soak.XXXXXX")
echo "soak: work directory $work"
echo "soak: building the sidecar and the load generator"
go build -o "$work/sidecar" ./cmd/sidecar
go build -o "$work/soak" ./tools/soak

# Each stream holds a client and an engine connection in the sidecar.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
need=$((STREAMS * 2 + 256))
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
	echo "soak: the descriptor limit $(ulimit -n) is below $need for $STREAMS streams" >&2
	exit 1
fi

args=(--listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --records "$work/records.jsonl"
	--max-connections $((STREAMS * 2 + 64)))
if [ -n "$UPSTREAM" ]; then
	args+=(--upstream "$UPSTREAM")
else
	# shellcheck disable=SC2206 # SIM_FLAGS is a flag list
	args+=($SIM_FLAGS)
fi
# shellcheck disable=SC2206
args+=($SIDECAR_FLAGS)

"$work/sidecar" "${args[@]}" 2>"$work/sidecar.log" &
pid=$!
gen=
cleanup() {
	[ -n "$gen" ] && kill "$gen" 2>/dev/null || true
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
}
trap cleanup EXIT

proxy= metrics=
for _ in $(seq 100); do
	line=$(grep -m1 'tokentap is up' "$work/sidecar.log" || true)
	if [ -n "$line" ]; then
		proxy=$(sed -E 's/.*proxy=(http:[^ ]+).*/\1/' <<<"$line")
		metrics=$(sed -E 's/.*metrics=(http:[^ ]+).*/\1/' <<<"$line")
		break
	fi
	kill -0 "$pid" 2>/dev/null || { echo "soak: the sidecar exited:" >&2; cat "$work/sidecar.log" >&2; exit 1; }
	sleep 0.1
done
[ -n "$proxy" ] || { echo "soak: the sidecar did not come up" >&2; cat "$work/sidecar.log" >&2; exit 1; }
echo "soak: sidecar pid $pid, proxy $proxy, metrics $metrics, upstream ${UPSTREAM:-built-in simulator}"

figures() { # label
	local rss g fds rec
	rss=$(awk '/^VmRSS:/ {printf "%.1f MB", $2/1024}' "/proc/$pid/status")
	g=$(curl -fsS "$metrics" | awk '/^go_goroutines / {print $2}')
	fds=$(find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
	rec=$(wc -l 2>/dev/null <"$work/records.jsonl" || echo 0)
	printf 'soak: %-6s rss=%s go_goroutines=%s open_fds=%s records=%s\n' "$1" "$rss" "$g" "$fds" "$rec"
}
figures idle

echo "soak: $STREAMS streams for $WARMUP of warm-up, then $DURATION"
"$work/soak" -url "$proxy" -streams "$STREAMS" -duration "$((warm_s + dur_s))s" -model "$MODEL" \
	-max-tokens "$MAX_TOKENS" -report 30s >"$work/soak.out" 2>&1 &
gen=$!
sleep "$warm_s"
figures start
# The end figures are taken under load, a moment before the generator
# stops starting new streams.
sleep "$((dur_s > 3 ? dur_s - 2 : dur_s))"
figures end
status=0
wait "$gen" || status=$?
gen=
cat "$work/soak.out"
sleep 3
# After the load the sidecar still holds its idle keep-alive connections
# to the engine (two goroutines and a descriptor each, closed after 90 s
# idle), and the built-in simulator, in the same process, the other end of
# each: "after" is the baseline plus those.
figures after
kill -0 "$pid" 2>/dev/null || { echo "soak: the sidecar died" >&2; status=1; }

m=$(curl -fsS "$metrics")
sum() { awk -v n="$1" -v f="$2" '($1 == n || index($1, n "{") == 1) && $0 ~ f {s += $NF} END {printf "%d", s}' <<<"$m"; }
echo "soak: sidecar counted requests=$(sum tokentap_requests_total 'traffic="live"')" \
	"success=$(sum tokentap_requests_total 'outcome="success",.*traffic="live"')" \
	"records_written=$(sum tokentap_records_written_total '')" \
	"records_dropped=$(sum tokentap_records_dropped_total '')" \
	"connections_rejected=$(sum tokentap_connections_rejected_total '')"
exit "$status"
