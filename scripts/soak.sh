#!/usr/bin/env bash
# soak.sh: an hour at 500 streams against the real sidecar binary with
# every instrument on (docs/performance.md, "An hour at 500 streams";
# issue 36): records, Prometheus /metrics scraped, OTLP spans and metrics
# to a built-in sink, usage injection, an SLO with `structure: required`
# (a share of the requests declare a tool), tenants from API keys, the
# workload capture to a file, and the live page polled every second.
# tools/soak samples the sidecar's RSS, heap, goroutines and descriptors
# every 10 s, and at the end fits each after the warm-up, checks that
# nothing was lost, draws a PNG and prints a markdown block for the doc.
# Not part of CI's default path (scripts/test.sh); run it by hand before a
# release or after a change to the data path.
#
#   scripts/soak.sh                               # the acceptance run: 500 streams, 1 hour, fits after 5 minutes
#   PNG=docs/soak.png scripts/soak.sh             # the same, the plot written where the doc shows it
#   DURATION=4m WARMUP=30s scripts/soak.sh        # a short run: checks the harness, not the slopes
#   UPSTREAM=http://127.0.0.1:8000 MODEL=my-model scripts/soak.sh
#
# Environment:
#   DURATION    the whole load, warm-up included (default 1h)
#   WARMUP      the first part, left out of the fits (default 5m)
#   STREAMS     concurrent streams kept in flight (default 500)
#   INTERVAL    between samples and /metrics scrapes (default 10s)
#   KEYS        API keys the requests cycle over: the tenants (default 8)
#   TOOL_SHARE  share of the requests that declare a tool (default 0.25)
#   DECODE      the simulator's decode step, the gap between a stream's
#               tokens (default 100ms: 500 streams make about 5,000 token
#               events/s, a fraction of the 2-core machine's)
#   MAX_TOKENS  max_tokens of every request (default 64)
#   UPSTREAM    engine URL; empty: the sidecar's built-in simulator
#   MODEL       model name sent (default: the simulator's, tokentap-sim)
#   SIM_FLAGS   simulator flags (default: no errors, no stalls, batch and
#               queue large enough for STREAMS, DECODE per step)
#   SIDECAR_FLAGS  more sidecar flags
#   WORK        the work directory (default: a new one under TMPDIR)
#   PNG         where the plot goes (default: soak.png in the work directory)
#   PPROF       an address (127.0.0.1:PORT) for Go's profiling endpoints:
#               the sidecar then runs as `peerbench sidecar -pprof PPROF`
#               (app.Run, as cmd/sidecar, plus /debug/pprof/), and the
#               sampler writes the allocation and heap profiles of each
#               sample whose heap in use passes BURST into profiles/ (at
#               most 5; a diagnosis run, not the acceptance run; default:
#               none)
#   BURST       heap in use, MiB, that makes a sample a burst (default 110)
#
# Everything listens on 127.0.0.1. The work directory keeps the samples
# (samples.csv), the records, the capture, the sidecar's log and the last
# scrape. Exit status: 0 when every check passes; 1 when one fails, the
# sidecar died or did not stop cleanly; 2 when the run's files could not
# be read.
set -euo pipefail

cd "$(dirname "$0")/.."
DURATION=${DURATION:-1h}
WARMUP=${WARMUP:-5m}
STREAMS=${STREAMS:-500}
INTERVAL=${INTERVAL:-10s}
KEYS=${KEYS:-8}
TOOL_SHARE=${TOOL_SHARE:-0.25}
DECODE=${DECODE:-100ms}
UPSTREAM=${UPSTREAM:-}
MODEL=${MODEL:-tokentap-sim}
MAX_TOKENS=${MAX_TOKENS:-64}
batch=$((STREAMS + 64))
SIM_FLAGS=${SIM_FLAGS:---sim.max-batch $batch --sim.max-queue $((2 * batch)) --sim.error-prob 0 --sim.stall-prob 0 --sim.max-tokens $MAX_TOKENS --sim.decode-base $DECODE --sim.decode-per-seq 0s --sim.prefill-base 2ms --sim.prefill-per-token 1us --sim.eos-prob 0.01}
SIDECAR_FLAGS=${SIDECAR_FLAGS:-}
PPROF=${PPROF:-}
BURST=${BURST:-110}

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
if [ "$warm_s" -ge "$dur_s" ]; then
	echo "soak: WARMUP ($WARMUP) must be shorter than DURATION ($DURATION)" >&2
	exit 2
fi

if [ -n "${WORK:-}" ]; then
	work=$WORK
	mkdir -p "$work"
else
	work=$(mktemp -d "${TMPDIR:-/tmp}/tokentap-soak.XXXXXX")
fi
PNG=${PNG:-$work/soak.png}
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain 2>/dev/null)" ] || commit="$commit (with uncommitted changes)"
echo "soak: work directory $work"
echo "soak: building the sidecar and tools/soak at $commit"
sidecar=("$work/sidecar")
sample_flags=()
if [ -n "$PPROF" ]; then
	go build -o "$work/sidecar" ./tools/peerbench
	sidecar=("$work/sidecar" sidecar -pprof "$PPROF" --)
	mkdir -p "$work/profiles"
	sample_flags=(-pprof "http://$PPROF" -burst "$BURST" -profiles "$work/profiles")
	echo "soak: PPROF: the sidecar runs as peerbench sidecar, profiles over $BURST MiB of heap into $work/profiles"
else
	go build -o "$work/sidecar" ./cmd/sidecar
fi
go build -o "$work/soak" ./tools/soak

# Each stream holds a client and an engine connection in the sidecar, and
# the built-in simulator, in the same process, the engine's end.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
need=$((STREAMS * 3 + 256))
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
	echo "soak: the descriptor limit $(ulimit -n) is below $need for $STREAMS streams" >&2
	exit 1
fi

pid= sink= sampler= gen=
cleanup() {
	for p in $gen $sampler; do kill "$p" 2>/dev/null || true; done
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	[ -n "$sink" ] && kill "$sink" 2>/dev/null || true
}
trap cleanup EXIT

# The OTLP sink: spans and metrics go there (Jaeger is not needed: the
# run is self-contained), and it counts what it was sent.
"$work/soak" otlp -listen 127.0.0.1:0 -addr-file "$work/otlp.addr" -out "$work/otlp.json" 2>"$work/otlp.log" &
sink=$!
for _ in $(seq 100); do [ -s "$work/otlp.addr" ] && break; sleep 0.1; done
[ -s "$work/otlp.addr" ] || { echo "soak: the OTLP sink did not start" >&2; cat "$work/otlp.log" >&2; exit 1; }
otlp=http://$(cat "$work/otlp.addr")

cat >"$work/tokentap.yaml" <<EOF
# scripts/soak.sh: every instrument on (issue 36).
slo:
  stall_threshold: 1s
  objectives:
    - name: soak
      target: 0.9
      window: 1h
      scope:
        apis: [chat]
      thresholds:
        ttft: 1s
        tpot: 250ms
        max_itl: 1s
      fluidity: {deadline: 1s, cadence: $DECODE}
      structure: required
tenant:
  from: api_key
  max_tenants: 20
  hash_key_file: $work/tenant.key
capture:
  file: $work/capture.jsonl
live:
  enabled: true
demo:
  enabled: "off"
EOF

args=(--config "$work/tokentap.yaml" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0
	--records "$work/records.jsonl" --inject-usage=true --max-connections $((STREAMS * 2 + 64)))
if [ -n "$UPSTREAM" ]; then
	args+=(--upstream "$UPSTREAM")
else
	# shellcheck disable=SC2206 # SIM_FLAGS is a flag list
	args+=($SIM_FLAGS)
fi
# shellcheck disable=SC2206
args+=($SIDECAR_FLAGS)

OTEL_SERVICE_NAME=tokentap-soak OTEL_TRACES_EXPORTER=otlp OTEL_METRICS_EXPORTER=otlp \
	OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf \
	OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="$otlp/v1/traces" OTEL_EXPORTER_OTLP_METRICS_ENDPOINT="$otlp/v1/metrics" \
	OTEL_METRIC_EXPORT_INTERVAL=10000 \
	"${sidecar[@]}" "${args[@]}" 2>"$work/sidecar.log" &
pid=$!

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
admin=${metrics%/metrics}
echo "soak: sidecar pid $pid, proxy $proxy, admin $admin, upstream ${UPSTREAM:-built-in simulator}, OTLP to $otlp"
echo "soak: $STREAMS streams for $DURATION (the fits after $WARMUP), $KEYS API keys, $TOOL_SHARE of the requests declaring a tool, a token every $DECODE"

# The sampler stops at the load's end, before the streams drain.
"$work/soak" sample -pid "$pid" -admin "$admin" -out "$work/samples.csv" -summary "$work/sampler.json" \
	-interval "$INTERVAL" -duration "${dur_s}s" "${sample_flags[@]}" 2>"$work/sampler.log" &
sampler=$!
status=0
"$work/soak" -url "$proxy" -streams "$STREAMS" -duration "${dur_s}s" -model "$MODEL" -max-tokens "$MAX_TOKENS" \
	-keys "$KEYS" -tool-share "$TOOL_SHARE" -summary "$work/load.json" -report 60s -max-error-ratio 0 \
	2>&1 | tee "$work/load.out" || status=1
wait "$sampler" || { echo "soak: the sampler failed:" >&2; cat "$work/sampler.log" >&2; status=1; }
sampler=

# The capture holds a finished request up to capture.settle (5 s) for
# earlier arrivals; then the last scrape, which the report compares with
# the files.
sleep 7
kill -0 "$pid" 2>/dev/null || { echo "soak: the sidecar died" >&2; tail -20 "$work/sidecar.log" >&2; exit 1; }
curl -fsS "$metrics" >"$work/metrics.txt"
kill -TERM "$pid"
sc=0
wait "$pid" || sc=$?
pid=
[ "$sc" = 0 ] || { echo "soak: the sidecar exited $sc at SIGTERM" >&2; status=1; }
kill -TERM "$sink"
wait "$sink" || true
sink=

rs=0
"$work/soak" report -dir "$work" -warmup "$WARMUP" -interval "$INTERVAL" -commit "$commit" -png "$PNG" || rs=$?
[ "$rs" = 0 ] || status=$rs
echo "soak: files in $work"
exit "$status"
