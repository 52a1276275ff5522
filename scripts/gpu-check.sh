#!/usr/bin/env bash
# Device check for GPU energy (issue: GPU energy from NVML). On a machine
# with an NVIDIA GPU, in well under 5 minutes:
#   1. runs the sidecar with energy on, sampling NVML every 100 ms
#      (in front of its built-in simulator: no engine needed);
#   2. loads the GPU with a known workload (bf16 matrix products through
#      PyTorch for LOAD_SECONDS, default 30) between two idle stretches;
#   3. reads the sidecar's tokentap_gpu_energy_joules_total before and
#      after, and integrates nvidia-smi's power readings (every 100 ms,
#      trapezoid) over the same window;
#   4. prints both and their relative difference; fails above TOLERANCE
#      (default 0.05: NVML's counter against 10 Hz power samples).
#   5. when dcgm-exporter or DCGM's dcgmi is installed, does the same with
#      the sidecar's DCGM source (energy.source dcgm, every 1 s): against
#      dcgm-exporter on 127.0.0.1:19400 (collecting every 1000 ms), else
#      against a stand-in exporter that serves `dcgmi dmon` readings of
#      fields 155 (power, W) and 156 (total energy, mJ) in dcgm-exporter's
#      format; fails above DCGM_TOLERANCE (default 0.10: the exporter's
#      1 s collection adds up to one collection interval of error at each
#      edge of the window). Exits 1 when either check failed.
# Usage: scripts/gpu-check.sh [prebuilt-sidecar-binary]
# (Build it where Go is: go build -tags nvml -o sidecar ./cmd/sidecar, with cgo.)
set -euo pipefail
BIN=${1:-}
OUTDIR=${OUT:-$(mktemp -d)}
LOAD_SECONDS=${LOAD_SECONDS:-30}
TOLERANCE=${TOLERANCE:-0.05}
DCGM_TOLERANCE=${DCGM_TOLERANCE:-0.10}
if [ -z "$BIN" ]; then
  go build -tags nvml -o "$OUTDIR/sidecar" ./cmd/sidecar
  BIN=$OUTDIR/sidecar
fi
command -v nvidia-smi >/dev/null || { echo "gpu-check: nvidia-smi not found: no NVIDIA driver here"; exit 2; }
nvidia-smi --query-gpu=index,name,power.draw,power.limit --format=csv

PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT

# power.draw.instant where the driver has it, else power.draw.
FIELD=power.draw.instant
nvidia-smi --query-gpu=$FIELD --format=csv,noheader >/dev/null 2>&1 || FIELD=power.draw

# start_sidecar NAME ADMIN ARGS...: runs the sidecar, waits until energy is on.
start_sidecar() {
  local name=$1 admin=$2; shift 2
  "$BIN" --admin-listen "$admin" "$@" >/dev/null 2>"$OUTDIR/sidecar-$name.log" &
  PIDS+=($!)
  for _ in $(seq 50); do curl -sf "http://$admin/healthz" >/dev/null && break; sleep 0.1; done
  grep -q 'tokentap_energy_enabled 1' <(curl -s "http://$admin/metrics") || { echo "gpu-check: $name: energy is off:"; grep energy "$OUTDIR/sidecar-$name.log"; exit 1; }
}

# check_window NAME ADMIN TOLERANCE: idle, load, idle; compares the
# sidecar's joules over the window with the nvidia-smi power integral.
check_window() {
  local name=$1 admin=$2 tol=$3 smi t0 t1 e0 e1
  energy() { curl -s "http://$admin/metrics" | awk '/^tokentap_gpu_energy_joules_total/ {s+=$NF} END {printf "%.6f\n", s}'; }
  python3 - "$OUTDIR/smi-$name.csv" "$FIELD" <<'PY' &
import subprocess, sys, time
out, field = sys.argv[1], sys.argv[2]
with open(out, "w") as f:
    p = subprocess.Popen(["nvidia-smi", f"--query-gpu=index,{field}", "--format=csv,noheader,nounits", "-lms", "100"],
                         stdout=subprocess.PIPE, text=True)
    for line in p.stdout:
        f.write(f"{time.time():.6f},{line.strip()}\n"); f.flush()
PY
  smi=$!
  PIDS+=("$smi")
  sleep 2
  t0=$(python3 -c 'import time; print(f"{time.time():.6f}")'); e0=$(energy)
  sleep 3   # idle
  python3 - "$LOAD_SECONDS" <<'PY'
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end, n = time.time() + float(sys.argv[1]), 0
while time.time() < end:
    for _ in range(10):
        c = a @ b
    torch.cuda.synchronize(); n += 10
print(f"load: {n} bf16 8192^3 products, {n * 2 * 8192**3 / float(sys.argv[1]) / 1e12:.0f} TFLOP/s")
PY
  sleep 3   # idle again
  t1=$(python3 -c 'import time; print(f"{time.time():.6f}")'); e1=$(energy)
  sleep 0.5
  kill "$smi" 2>/dev/null || true
  python3 - "$OUTDIR/smi-$name.csv" "$t0" "$t1" "$e0" "$e1" "$tol" "$name" <<'PY'
import collections, sys
path, t0, t1, e0, e1, tol, name = sys.argv[1], *map(float, sys.argv[2:7]), sys.argv[7]
series = collections.defaultdict(list)
for line in open(path):
    parts = [p.strip() for p in line.split(",")]
    try:
        series[parts[1]].append((float(parts[0]), float(parts[2])))
    except (IndexError, ValueError):
        pass
smi = 0.0
for gpu, pts in series.items():
    pts = [p for p in pts if t0 - 0.2 <= p[0] <= t1 + 0.2]
    for (ta, pa), (tb, pb) in zip(pts, pts[1:]):
        lo, hi = max(ta, t0), min(tb, t1)
        if hi > lo:
            smi += (pa + pb) / 2 * (hi - lo)
side = e1 - e0
diff = (side - smi) / smi if smi else float("inf")
print(f"{name}: window {t1 - t0:.1f} s over {len(series)} GPU(s): sidecar {side:.1f} J, nvidia-smi integral {smi:.1f} J, "
      f"difference {diff * 100:+.2f}% (tolerance ±{tol * 100:.0f}%)")
sys.exit(0 if abs(diff) <= tol else 1)
PY
}

# NVML, every 100 ms, in front of the built-in simulator.
start_sidecar nvml 127.0.0.1:19464 --energy on --energy.interval 100ms --listen 127.0.0.1:18080
FAIL=0
check_window nvml 127.0.0.1:19464 "$TOLERANCE" || FAIL=1

# DCGM, when it is installed.
if command -v dcgm-exporter >/dev/null; then
  dcgm-exporter -a 127.0.0.1:19400 -c 1000 >"$OUTDIR/dcgm-exporter.log" 2>&1 &
  PIDS+=($!)
elif command -v dcgmi >/dev/null; then
  # A stand-in exporter: each scrape runs dcgmi dmon once for fields 155
  # (power, W) and 156 (total energy, mJ), labelled by nvidia-smi's UUIDs.
  python3 - <<'PY' >"$OUTDIR/dcgm-standin.log" 2>&1 &
import http.server, subprocess
def body():
    uuids = {}
    for line in subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,name", "--format=csv,noheader"],
                               capture_output=True, text=True, check=True).stdout.splitlines():
        i, u, n = [p.strip() for p in line.split(",")]
        uuids[i] = (u, n)
    power, energy = [], []
    for line in subprocess.run(["dcgmi", "dmon", "-e", "155,156", "-c", "1"],
                               capture_output=True, text=True, check=True).stdout.splitlines():
        f = line.split()
        if len(f) >= 4 and f[0] == "GPU" and f[1] in uuids and all(x.replace(".", "", 1).isdigit() for x in f[2:4]):
            u, n = uuids[f[1]]
            l = f'gpu="{f[1]}",UUID="{u}",modelName="{n}"'
            power.append(f"DCGM_FI_DEV_POWER_USAGE{{{l}}} {f[2]}")
            energy.append(f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{l}}} {f[3]}")
    return "\n".join(["# TYPE DCGM_FI_DEV_POWER_USAGE gauge", *power,
                      "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter", *energy]) + "\n"
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = body().encode()
        self.send_response(200); self.send_header("Content-Type", "text/plain; version=0.0.4"); self.end_headers()
        self.wfile.write(b)
http.server.HTTPServer(("127.0.0.1", 19400), H).serve_forever()
PY
  PIDS+=($!)
else
  echo "gpu-check: neither dcgm-exporter nor dcgmi is installed: the DCGM source is not checked"
  exit "$FAIL"
fi
for _ in $(seq 100); do curl -sf http://127.0.0.1:19400/metrics | grep -q '^DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION' && break; sleep 0.2; done
# Outside Kubernetes there is no pod label: select every GPU by index.
DEVICES=$(nvidia-smi --query-gpu=index --format=csv,noheader | sed 's/.*/"&"/' | paste -sd, -)
cat >"$OUTDIR/dcgm.yaml" <<YAML
energy:
  source: dcgm
  interval: 1s
  devices: [$DEVICES]
  dcgm:
    url: http://127.0.0.1:19400/metrics
YAML
start_sidecar dcgm 127.0.0.1:19465 --config "$OUTDIR/dcgm.yaml" --listen 127.0.0.1:18081
check_window dcgm 127.0.0.1:19465 "$DCGM_TOLERANCE" || FAIL=1
exit "$FAIL"
