# syntax=docker/dockerfile:1
#
# tokentap's container image. Two targets:
#
#   runtime (the default, last stage): a cgo build on a glibc base, so
#            that NVML's libnvidia-ml.so.1 can be loaded when the NVIDIA
#            container toolkit mounts it (GPU energy, docs/energy.md).
#   static:  a CGO_ENABLED=0 build on a static base: no NVML, no energy
#            (tokentap_energy_info{reason="no_cgo"}), everything else.
#
#   docker build -t tokentap .
#   docker build --target static -t tokentap:static .
#
# Both run as the non-root user 65532 and listen on 8080 (the proxy) and
# 9464 (/metrics, /healthz, /readyz, /slo, /probes). There is no
# HEALTHCHECK: in Kubernetes the probes are /readyz and /healthz on 9464.
# The base images are build arguments (CI builds with locally assembled
# ones: tools/deploycheck).

ARG GO_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/base-debian12:nonroot
ARG STATIC_RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${GO_IMAGE} AS source
ARG GOPROXY=https://proxy.golang.org,direct
ARG GOFLAGS=-buildvcs=false
ENV GOPROXY=${GOPROXY} GOFLAGS=${GOFLAGS} GOTOOLCHAIN=local
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .

FROM source AS build-static
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/tokentap ./cmd/sidecar

FROM source AS build
# NVML is built in only with the nvml tag (docs/energy.md, "Builds");
# go-nvml's C header marks old NVML calls deprecated, and we call none.
RUN CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" \
    go build -tags nvml -trimpath -ldflags="-s -w" -o /out/tokentap ./cmd/sidecar

FROM ${STATIC_RUNTIME_IMAGE} AS static
COPY --from=build-static /out/tokentap /usr/local/bin/tokentap
USER 65532:65532
ENV TOKENTAP_LISTEN=0.0.0.0:8080 TOKENTAP_ADMIN_LISTEN=0.0.0.0:9464
EXPOSE 8080 9464
ENTRYPOINT ["/usr/local/bin/tokentap"]

FROM ${RUNTIME_IMAGE} AS runtime
COPY --from=build /out/tokentap /usr/local/bin/tokentap
USER 65532:65532
# The NVIDIA container toolkit mounts NVML for these capabilities; which
# GPUs are visible is the runtime's choice (NVIDIA_VISIBLE_DEVICES).
ENV TOKENTAP_LISTEN=0.0.0.0:8080 TOKENTAP_ADMIN_LISTEN=0.0.0.0:9464 \
    NVIDIA_DRIVER_CAPABILITIES=utility
EXPOSE 8080 9464
ENTRYPOINT ["/usr/local/bin/tokentap"]
