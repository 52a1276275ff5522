#!/usr/bin/env bash
# Installs the real tools that the tests and CI gates use. Idempotent: a tool
# that is already installed at its pinned version is left alone, so a second
# run builds nothing. Needs root for apt-get (prometheus, promtool).
#
#   prometheus, promtool  Debian package (the SLO and rules tests)
#   jaeger                v1.76.0, pinned in tools/jaeger/go.mod (a real OTLP
#                         receiver for the tracing tests); built from source,
#                         about ten minutes on two cores the first time
#   staticcheck           pinned below; `go install`ed
#   benchstat             pinned in tools/benchstat/go.mod (golang.org/x/perf);
#                         scripts/bench-compare.sh compares the hot path's
#                         benchmarks with it (docs/performance.md)
#   helm                  pinned below; built from its Go module (about three
#                         minutes on two cores the first time): the chart's
#                         lint and template checks (tools/deploycheck)
#   buildah               Debian package: builds the Dockerfile's images
#                         without a daemon or a registry (tools/deploycheck)
#   chromium              Debian package, /usr/bin/chromium: the browser the
#                         live page's tests drive (livetest/, chromedp)
#   ollama                v0.17.4, pinned in tools/ollama/go.mod (a real engine
#                         for enginetest/); built from source with cgo, CPU
#                         only, about 6-11 minutes on two cores the first time;
#                         needs Debian's nlohmann-json3-dev and libstb-dev
#
# Go binaries go to $(go env GOBIN), or $(go env GOPATH)/bin when GOBIN is
# unset; put that folder on PATH (scripts/test.sh does).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

STATICCHECK_VERSION=v0.8.2 # honnef.co/go/tools/cmd/staticcheck
HELM_VERSION=v3.22.0       # helm.sh/helm/v3/cmd/helm
# Jaeger's version is the one that tools/jaeger/go.mod requires.
JAEGER_VERSION="$(awk '$1 == "github.com/jaegertracing/jaeger" { print $2; exit }' "$root/tools/jaeger/go.mod")"
if [ -z "$JAEGER_VERSION" ]; then
  echo "install-test-tools: no github.com/jaegertracing/jaeger requirement in tools/jaeger/go.mod" >&2
  exit 1
fi
# Ollama's version is the one that tools/ollama/go.mod requires.
OLLAMA_VERSION="$(awk '$1 == "github.com/ollama/ollama" { print $2; exit }' "$root/tools/ollama/go.mod")"
if [ -z "$OLLAMA_VERSION" ]; then
  echo "install-test-tools: no github.com/ollama/ollama requirement in tools/ollama/go.mod" >&2
  exit 1
fi

gobin="$(go env GOBIN)"
[ -n "$gobin" ] || gobin="$(go env GOPATH)/bin"
mkdir -p "$gobin"

# modversion BIN MODULE: the version of MODULE that the Go binary BIN was
# built with (as the main module or a dependency), or nothing.
modversion() {
  [ -x "$1" ] || return 0
  go version -m "$1" 2>/dev/null | awk -v m="$2" '($1 == "mod" || $1 == "dep") && $2 == m { print $3; exit }'
}
# gotoolchain BIN: the Go release that built BIN (go1.26.8), or nothing.
gotoolchain() {
  [ -x "$1" ] || return 0
  go version "$1" 2>/dev/null | awk '{ print $2 }'
}

# prometheus and promtool (Debian).
need_apt=()
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing prometheus (apt-get; needs root)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # The Debian package starts a system Prometheus on :9090; the tests start
  # their own on free loopback ports and need no system one.
  (systemctl stop prometheus 2>/dev/null || service prometheus stop 2>/dev/null || pkill -x prometheus) >/dev/null 2>&1 || true
fi

# buildah (Debian), for the image test.
if ! command -v buildah >/dev/null 2>&1; then
  echo "installing buildah (apt-get; needs root)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends buildah >/dev/null
fi

# chromium (Debian), for the browser tests of the admin pages (livetest/).
if ! command -v chromium >/dev/null 2>&1; then
  echo "installing chromium (apt-get; needs root)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null
fi

# jaeger, built from the pinned tool module. Rebuilt only when the binary is
# missing or was built from another Jaeger version.
have="$(modversion "$gobin/jaeger" github.com/jaegertracing/jaeger)"
if [ "$have" != "$JAEGER_VERSION" ]; then
  echo "building jaeger $JAEGER_VERSION from tools/jaeger (have: ${have:-none}; ~10 min on two cores)"
  (cd "$root/tools/jaeger" && go build -o "$gobin/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger)
fi

# staticcheck. Rebuilt when missing, at another version, or built by another
# Go release (staticcheck must understand the Go version it checks).
have="$(modversion "$gobin/staticcheck" honnef.co/go/tools)"
have_go="$(gotoolchain "$gobin/staticcheck")"
want_go="$(go env GOVERSION)"
if [ "$have" != "$STATICCHECK_VERSION" ] || [ "$have_go" != "$want_go" ]; then
  echo "installing staticcheck $STATICCHECK_VERSION (have: ${have:-none} ${have_go})"
  GOBIN="$gobin" go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
fi

# benchstat, built from the pinned tool module. Rebuilt only when the binary
# is missing or was built from another golang.org/x/perf version.
BENCHSTAT_VERSION="$(awk '$1 == "golang.org/x/perf" { print $2; exit }' "$root/tools/benchstat/go.mod")"
have="$(modversion "$gobin/benchstat" golang.org/x/perf)"
if [ -z "$BENCHSTAT_VERSION" ] || [ "$have" != "$BENCHSTAT_VERSION" ]; then
  echo "building benchstat ${BENCHSTAT_VERSION:-?} from tools/benchstat (have: ${have:-none})"
  (cd "$root/tools/benchstat" && go build -o "$gobin/benchstat" golang.org/x/perf/cmd/benchstat)
fi

# helm, built from its Go module at the pinned version.
have="$(modversion "$gobin/helm" helm.sh/helm/v3)"
if [ "$have" != "$HELM_VERSION" ]; then
  echo "building helm $HELM_VERSION from its Go module (have: ${have:-none}; ~3 min on two cores)"
  GOBIN="$gobin" CGO_ENABLED=0 go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi

# ollama, built from the pinned tool module. Rebuilt only when the binary is
# missing or was built from another Ollama version. Its llama.cpp includes
# nlohmann/json.hpp and stb/stb_image.h (Debian) and miniaudio/miniaudio.h,
# which malgo's module (pinned in tools/ollama/go.mod) ships: a stable
# folder holds a "miniaudio" link to it, so that the include path, and with
# it Go's build cache of the C and C++ objects, is the same on every run.
have="$(modversion "$gobin/ollama" github.com/ollama/ollama)"
if [ "$have" != "$OLLAMA_VERSION" ]; then
  echo "building ollama $OLLAMA_VERSION from tools/ollama (have: ${have:-none}; 6-11 min on two cores)"
  if ! dpkg -s nlohmann-json3-dev libstb-dev >/dev/null 2>&1; then
    echo "installing nlohmann-json3-dev and libstb-dev (apt-get; needs root)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends nlohmann-json3-dev libstb-dev >/dev/null
  fi
  (
    cd "$root/tools/ollama"
    malgo="$(go list -m -f '{{.Dir}}' github.com/gen2brain/malgo)"
    if [ ! -f "$malgo/miniaudio.h" ]; then
      go mod download github.com/gen2brain/malgo
      malgo="$(go list -m -f '{{.Dir}}' github.com/gen2brain/malgo)"
    fi
    inc="${XDG_CACHE_HOME:-$HOME/.cache}/tokentap/ollama-include"
    mkdir -p "$inc"
    ln -sfn "$malgo" "$inc/miniaudio"
    CGO_ENABLED=1 CGO_CPPFLAGS="-I$inc" CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}" \
      go build -ldflags "-X github.com/ollama/ollama/version.Version=${OLLAMA_VERSION#v}" \
      -o "$gobin/ollama" github.com/ollama/ollama
  )
fi

echo "jaeger:      $gobin/jaeger ($(modversion "$gobin/jaeger" github.com/jaegertracing/jaeger), tools/jaeger)"
echo "staticcheck: $gobin/staticcheck ($("$gobin/staticcheck" -version 2>&1 | head -1))"
echo "prometheus:  $(command -v prometheus) ($(prometheus --version 2>&1 | head -1))"
echo "promtool:    $(command -v promtool) ($(promtool --version 2>&1 | head -1))"
echo "benchstat:   $gobin/benchstat ($(modversion "$gobin/benchstat" golang.org/x/perf), tools/benchstat)"
echo "helm:        $gobin/helm ($(modversion "$gobin/helm" helm.sh/helm/v3))"
echo "buildah:     $(command -v buildah) ($(buildah --version 2>&1 | head -1))"
echo "ollama:      $gobin/ollama ($(modversion "$gobin/ollama" github.com/ollama/ollama), tools/ollama)"
