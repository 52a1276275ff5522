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
# scripts/install-test-tools.sh; built here if missing). Run it on a quiet
# machine: the two sides run one after the other.
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

run() { # DIR OUT: the benchmarks of the packages that exist in DIR
  local dir=$1 out=$2 have=()
  for p in "${pkgs[@]}"; do
    [ -d "$dir/$p" ] && have+=("$p")
  done
  (cd "$dir" && go test -run '^$' -bench "$bench" -benchmem -benchtime "$benchtime" -count "$count" "${have[@]}") >"$out"
}
echo "bench-compare: base $(git log -1 --format='%h %s' "$rev" | cut -c1-72)"
echo "bench-compare: $count runs of $bench, -benchtime $benchtime, each side"
run "$work/base" "$work/base.txt"
run "$root" "$work/head.txt"
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
