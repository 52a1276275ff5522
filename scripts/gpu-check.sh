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
#   4. prints both and their relative difference; exits 1 above TOLERANCE
#      (default 0.05: NVML's counter against 10 Hz power samples).
# Usage: scripts/gpu-check.sh [prebuilt-sidecar-binary]
# (Build it where Go is: go build -o sidecar ./cmd/sidecar, with cgo.)
set -euo pipefail
BIN=${1:-}
OUTDIR=${OUT:-$(mktemp -d)}
LOAD_SECONDS=${LOAD_SECONDS:-30}
TOLERANCE=${TOLERANCE:-0.05}
ADMIN=127.0.0.1:19464
if [ -z "$BIN" ]; then
  go build -o "$OUTDIR/sidecar" ./cmd/sidecar
  BIN=$OUTDIR/sidecar
fi
command -v nvidia-smi >/dev/null || { echo "gpu-check: nvidia-smi not found: no NVIDIA driver here"; exit 2; }
nvidia-smi --query-gpu=index,name,power.draw,power.limit --format=csv

"$BIN" --energy on --energy.interval 100ms --listen 127.0.0.1:18080 --admin-listen "$ADMIN" >/dev/null 2>"$OUTDIR/sidecar.log" &
SIDECAR=$!
trap 'kill $SIDECAR $SMI 2>/dev/null || true' EXIT
for i in $(seq 50); do curl -sf "http://$ADMIN/healthz" >/dev/null && break; sleep 0.1; done
grep -q 'tokentap_energy_enabled 1' <(curl -s "http://$ADMIN/metrics") || { echo "gpu-check: energy is off:"; grep energy "$OUTDIR/sidecar.log"; exit 1; }

# power.draw.instant where the driver has it, else power.draw.
FIELD=power.draw.instant
nvidia-smi --query-gpu=$FIELD --format=csv,noheader >/dev/null 2>&1 || FIELD=power.draw
energy() { curl -s "http://$ADMIN/metrics" | awk '/^tokentap_gpu_energy_joules_total/ {s+=$NF} END {printf "%.6f\n", s}'; }

python3 - "$OUTDIR/smi.csv" "$FIELD" <<'PY' &
import subprocess, sys, time
out, field = sys.argv[1], sys.argv[2]
with open(out, "w") as f:
    p = subprocess.Popen(["nvidia-smi", f"--query-gpu=index,{field}", "--format=csv,noheader,nounits", "-lms", "100"],
                         stdout=subprocess.PIPE, text=True)
    for line in p.stdout:
        f.write(f"{time.time():.6f},{line.strip()}\n"); f.flush()
PY
SMI=$!
sleep 2
T0=$(python3 -c 'import time; print(f"{time.time():.6f}")'); E0=$(energy)
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
T1=$(python3 -c 'import time; print(f"{time.time():.6f}")'); E1=$(energy)
sleep 0.5
kill $SMI 2>/dev/null || true

python3 - "$OUTDIR/smi.csv" "$T0" "$T1" "$E0" "$E1" "$TOLERANCE" <<'PY'
import collections, sys
path, t0, t1, e0, e1, tol = sys.argv[1], *map(float, sys.argv[2:])
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
print(f"window {t1 - t0:.1f} s over {len(series)} GPU(s): sidecar {side:.1f} J, nvidia-smi integral {smi:.1f} J, "
      f"difference {diff * 100:+.2f}% (tolerance ±{tol * 100:.0f}%)")
sys.exit(0 if abs(diff) <= tol else 1)
PY
