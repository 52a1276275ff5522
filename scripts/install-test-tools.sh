#!/usr/bin/env bash
# Installs the real tools the integration tests use. Idempotent; needs root
# for apt-get. Versions are pinned here and nowhere else.
set -euo pipefail
need_apt=()
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
if [ ${#need_apt[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # The Debian package starts a system Prometheus on :9090; the tests start
  # their own on free loopback ports and need no system one.
  (systemctl stop prometheus 2>/dev/null || service prometheus stop 2>/dev/null || pkill -x prometheus) >/dev/null 2>&1 || true
fi
# Jaeger v1.76.0, pinned in tools/jaeger (a real OTLP receiver for the
# tracing tests). Built once; a few minutes on two cores.
if ! command -v jaeger >/dev/null 2>&1; then
  gobin="$(go env GOPATH)/bin"
  mkdir -p "$gobin"
  (cd "$(dirname "$0")/../tools/jaeger" && go build -o "$gobin/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger)
fi
echo "jaeger:     $(command -v jaeger) (v1.76.0, tools/jaeger)"
echo "prometheus: $(prometheus --version 2>&1 | head -1)"
echo "promtool:   $(promtool --version 2>&1 | head -1)"
