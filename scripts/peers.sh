#!/usr/bin/env bash
# peers.sh: what the sidecar adds to a token stream, and what it costs, next
# to its peers, in one run (tools/peerbench; docs/performance.md explains
# the table). Not part of scripts/test.sh's checks: CI runs only --smoke.
#
#   scripts/peers.sh                  the table at 50 and 200 streams, 3 runs,
#                                     and the 1,000-stream memory run (~15 min)
#   scripts/peers.sh --capacity       the capacity of direct, bare Go, the
#                                     sidecar and nginx: streams raised in steps
#                                     until each path's added p99 passes 5 ms
#                                     (at most ~8 min)
#   scripts/peers.sh --smoke          a few seconds of each, and two short
#                                     capacity steps, to check that the harness
#                                     works (what CI runs); with --capacity,
#                                     the capacity steps alone
#   scripts/peers.sh --profile DIR    also CPU and allocation profiles of the
#                                     sidecar over each window of the first run
#   scripts/peers.sh --perf DIR       instead of the table: bare Go, the sidecar (on
#                                     its event loop, the default) and the sidecar on
#                                     net/http's path (--event-loop=false) at 200 streams, one after the other, each
#                                     sampled by `perf record -g` for 18 s, kernel
#                                     included, and their CPU split by part per
#                                     event (`peerbench split`; ~1 min; needs perf:
#                                     apt-get install linux-perf; as root)
#   scripts/peers.sh -- FLAGS...      more `peerbench run` flags (see
#                                     `go run ./tools/peerbench run -h`), or
#                                     `peerbench capacity` flags with --capacity
#
# Paths: direct, a bare Go httputil.ReverseProxy, an epoll event-loop relay
# (peerbench loop: the relay alone, measuring nothing), the sidecar (on its
# event loop, the default) with every instrument on (records, Prometheus, OTLP spans to Jaeger and OTLP metrics,
# usage injection, two SLOs, one with structure: required over the 1 request
# in 4 that declares a tool, tenants from the API keys the client sends, the
# capture to a file, a canary probe, the live page polled as a browser), the
# sidecar with OTLP off, the sidecar on net/http's path with every
# instrument on (tokentap-nethttp: --event-loop=false), and nginx, haproxy and
# caddy when installed (Debian:
# apt-get install nginx-light haproxy caddy; write a /usr/sbin/policy-rc.d
# that exits 101 first, so that apt starts no service). --capacity runs
# direct, bare Go, the sidecar and nginx; BASELINE and --profile apply to the
# table only. Jaeger is the one scripts/install-test-tools.sh builds; without
# it traces go to a built-in OTLP sink.
#
# Environment:
#   PEERS_DIR   work folder (configs, logs, records, binaries); default: new temp
#   BASELINE    a git revision: its sidecar also runs, as tokentap-base (built in
#               a git worktree), for a before/after in the same run
#   CGO_CFLAGS  default: -O2 -g -Wno-deprecated-declarations (go-nvml's headers)
#
# Everything listens on 127.0.0.1 and every load is bounded in streams and
# time. Exit status: non-zero when the sidecar lost a stream or a path
# carried no event. The figures move ±25% from run to run on a shared
# machine: compare ratios within one run and take the median of three.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
gobin="$(go env GOBIN)"
[ -n "$gobin" ] || gobin="$(go env GOPATH)/bin"
export PATH="$PATH:$gobin"

smoke=false
capacity=false
profile=""
perfdir=""
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) smoke=true ;;
    --capacity) capacity=true ;;
    --profile) profile="$2"; shift ;;
    --perf) perfdir="$2"; shift ;;
    --) shift; extra=("$@"); break ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "scripts/peers.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

work="${PEERS_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/peers.XXXXXX")}"
mkdir -p "$work"
echo "peers: work folder $work"
go build -o "$work/sidecar" ./cmd/sidecar
go build -o "$work/peerbench" ./tools/peerbench

# The capacity's short steps in the smoke: two, a second each, traces to the
# built-in sink (Jaeger's start is the table's to check).
smokecap=(-dir "$work/capacity" -sidecar "$work/sidecar" -steps 5,10 -duration 1s -warmup 1s -budget 1m -jaeger none)
if [ "$capacity" = true ]; then
  if [ "$smoke" = true ]; then
    "$work/peerbench" capacity "${smokecap[@]}" "${extra[@]}"
  else
    "$work/peerbench" capacity -dir "$work/capacity" -sidecar "$work/sidecar" "${extra[@]}"
  fi
  exit 0
fi

if [ -n "$perfdir" ]; then
  command -v perf >/dev/null || { echo "scripts/peers.sh: --perf needs perf (apt-get install linux-perf)" >&2; exit 2; }
  mkdir -p "$perfdir"
  specs=()
  for p in bare tokentap tokentap-nethttp; do
    "$work/peerbench" run -dir "$work/perf-$p" -sidecar "$work/sidecar" -only "$p" -runs 1 -streams 200 \
      -duration 24s -warmup 3s -memory 0 -nootlp=false "${extra[@]}" >"$perfdir/$p.log" 2>&1 &
    run=$!
    # The proxy's own process: bare Go is a peerbench mode, the sidecar its binary.
    pat="peerbench bare -listen"
    [ "$p" != bare ] && pat="^$work/sidecar "
    pid=""
    for _ in $(seq 300); do
      pid="$(pgrep -f "$pat" | head -1 || true)"
      [ -n "$pid" ] && break
      sleep 0.1
    done
    [ -n "$pid" ] || { echo "scripts/peers.sh: no $p process" >&2; exit 1; }
    sleep 5 # past the 3 s warm-up: the 18 s sampled lie inside the 24 s window
    perf record -q -F 1999 -g -o "$perfdir/$p.data" -p "$pid" -- sleep 18
    wait "$run"
    evs="$(awk -F'|' -v p=" $p " '$2 == p { gsub(/ /, "", $3); print $3; exit }' "$perfdir/$p.log")"
    [ -n "$evs" ] || { echo "scripts/peers.sh: no events/s for $p in $perfdir/$p.log" >&2; exit 1; }
    perf script -i "$perfdir/$p.data" -F ip,sym,dso >"$perfdir/$p.txt" 2>/dev/null
    specs+=("$p=$perfdir/$p.txt:$((evs * 18))")
    echo "peers: $p carried $evs events/s; perf's samples in $perfdir/$p.data"
  done
  "$work/peerbench" split -hz 1999 "${specs[@]}"
  exit 0
fi

args=(-dir "$work/run")
if [ "$smoke" = true ]; then
  args+=(-streams 5 -duration 2s -warmup 1s -runs 1 -memory 20 -memory-duration 2s)
fi
if [ -n "$profile" ]; then
  # Profiles come from the same sidecar code run by peerbench itself, which
  # serves /debug/pprof/ (the sidecar binary serves none).
  args+=(-sidecar "$work/peerbench" -profile "$profile")
else
  args+=(-sidecar "$work/sidecar")
fi
if [ -n "${BASELINE:-}" ]; then
  rev="$(git rev-parse --verify "$BASELINE^{commit}")"
  src="$work/base-src"
  rm -rf "$src"
  git worktree add -q --detach "$src" "$rev"
  trap 'git worktree remove --force "$src" >/dev/null 2>&1 || true' EXIT
  (cd "$src" && go build -o "$work/sidecar-base" ./cmd/sidecar)
  args+=(-baseline "$work/sidecar-base")
  echo "peers: tokentap-base is $rev"
fi
"$work/peerbench" run "${args[@]}" "${extra[@]}"
if [ "$smoke" = true ]; then
  "$work/peerbench" capacity "${smokecap[@]}"
fi
