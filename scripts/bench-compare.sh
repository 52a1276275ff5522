#!/usr/bin/env bash
# bench-compare.sh: the hot path's Go benchmarks on a base revision (the
# previous commit by default, checked out in a git worktree) and on the
# working tree, compared with benchstat (docs/performance.md).
#
#   scripts/bench-compare.sh          HEAD~1 against the working tree
#   scripts/bench-compare.sh REV      REV against the working tree
#
# The benchmarks: per token event, the tap with the real Prometheus
# observers (BenchmarkTapEvent, both modes), the SSE framer and the OpenAI
# parser; per request, both metric backends' Publish and the record's
# encoding and queueing. A benchmark the base revision lacks is shown for
# the working tree alone.
#
# Exit status 1 when benchstat finds a significant slowdown (p < 0.05)
# larger than MAX_SLOWDOWN percent in sec/op, or any significant rise in
# allocs/op (the per-event benchmarks must stay at 0); 2 on a usage error.
#
# Environment:
#   COUNT         runs of each benchmark per side (default 10; benchstat
#                 wants at least 6 for its confidence intervals)
#   BENCHTIME     -benchtime of each run (default 200000x)
#   BENCH         -bench regexp (default: the hot path, as above)
#   MAX_SLOWDOWN  percent (default 10)
#   CGO_CFLAGS    default: -O2 -g -Wno-deprecated-declarations
#
# benchstat comes from tools/benchstat (installed by
# scripts/install-test-tools.sh; built here if missing). The two sides'
# test binaries are built once and run in turns (base, head, base, ...),
# so that a change in the machine's load hits both; still, run it on a
# quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

case "${1:-}" in
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
[ $# -le 1 ] || { echo "usage: scripts/bench-compare.sh [REV]" >&2; exit 2; }
base="${1:-HEAD~1}"
rev="$(git rev-parse --verify --quiet "$base^{commit}")" || { echo "bench-compare: no such revision: $base" >&2; exit 2; }

export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
count="${COUNT:-10}"
benchtime="${BENCHTIME:-200000x}"
bench="${BENCH:-^Benchmark(TapEvent|FramerFeed|ParseOpenAI|PublishPrometheus|PublishOTLP|MarshalRecord|FileWrite)}"
max="${MAX_SLOWDOWN:-10}"
pkgs=(./proxy/ ./stream/ ./exporter/ ./record/)

gobin="$(go env GOBIN)"
[ -n "$gobin" ] || gobin="$(go env GOPATH)/bin"
benchstat="$gobin/benchstat"
if [ ! -x "$benchstat" ]; then
  echo "bench-compare: building benchstat from tools/benchstat"
  (cd tools/benchstat && go build -o "$benchstat" golang.org/x/perf/cmd/benchstat)
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/bench-compare.XXXXXX")"
cleanup() {
  git -C "$root" worktree remove --force "$work/base" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
git worktree add -q --detach "$work/base" "$rev"

build() { # DIR BINDIR: the test binaries of the packages that exist in DIR
  local dir=$1 bin=$2
  mkdir -p "$bin"
  for p in "${pkgs[@]}"; do
    [ -d "$dir/$p" ] || continue
    (cd "$dir" && go test -c -o "$bin/$(basename "$p").test" "$p")
  done
}
run() { # DIR BINDIR OUT: one run of every benchmark, appended to OUT
  local dir=$1 bin=$2 out=$3
  for p in "${pkgs[@]}"; do
    local t="$bin/$(basename "$p").test"
    [ -x "$t" ] || continue
    (cd "$dir/$p" && "$t" -test.run '^$' -test.bench "$bench" -test.benchmem -test.benchtime "$benchtime" -test.count 1) >>"$out"
  done
}
echo "bench-compare: base $(git log -1 --format='%h %s' "$rev" | cut -c1-72)"
echo "bench-compare: $count runs of $bench, -benchtime $benchtime, each side, interleaved"
build "$work/base" "$work/bin-base"
build "$root" "$work/bin-head"
# Interleaved, base then head, count times: a drift of the machine's load
# (it is shared) hits both sides alike instead of one.
for _ in $(seq "$count"); do
  run "$work/base" "$work/bin-base" "$work/base.txt"
  run "$root" "$work/bin-head" "$work/head.txt"
done
"$benchstat" base="$work/base.txt" head="$work/head.txt" | tee "$work/stat.txt"

# benchstat prints one table per unit; a row's change is "+12.34%" with
# its p-value, or "~" when not significant.
awk -v max="$max" '
  /vs base/ { unit = /sec\/op/ ? "sec/op" : /allocs\/op/ ? "allocs/op" : "other"; next }
  /^$/ { next }
  unit != "" && $1 != "geomean" && match($0, /\+([0-9.]+|Inf)% \(p=[0-9.]+/) {
    s = substr($0, RSTART + 1, RLENGTH - 1)
    pct = s + 0
    p = substr(s, index(s, "p=") + 2) + 0
    if (p < 0.05 && ((unit == "sec/op" && pct > max) || unit == "allocs/op")) {
      printf "bench-compare: REGRESSION %s %s +%s%%\n", $1, unit, pct
      bad = 1
    }
  }
  END { exit bad }
' "$work/stat.txt" || { echo "bench-compare: regressions above (MAX_SLOWDOWN=$max%)" >&2; exit 1; }
echo "bench-compare: no significant regression (MAX_SLOWDOWN=$max%)"
