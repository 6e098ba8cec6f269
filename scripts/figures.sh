#!/usr/bin/env bash
# `make figures`: the README's pictures, regenerated from runs on this machine (docs/images/).
#   dispatch.png     pw bench dispatch --plot (embedded cluster)
#   transfer.png     pw bench transfer --plot (ICI and DCN paths beside memcpy and raw TCP)
#   collectives.png  pw bench collectives --plot (2 and 4 worker processes)
#   figure9.png      pw trace --plot of four tenants at shares 1:2:4:8 sharing a pw up cluster's
#                    island (as the paper's Fig. 9)
#   multitenant.png  pw bench multitenant --plot (4 tenants at 1:2:4:8, 0.33 ms computations)
#   dashboard.png    pw dashboard in headless Chromium during the same load
set -euo pipefail
cd "$(dirname "$0")/.."
PW=build/bin/pw
OUT=docs/images
mkdir -p "$OUT"
export PW_STATE_DIR
PW_STATE_DIR=$(mktemp -d)
trap '$PW down >/dev/null 2>&1 || true; rm -rf "$PW_STATE_DIR"' EXIT

$PW bench dispatch --plot "$OUT/dispatch.png" > /dev/null
$PW bench transfer --sizes 1024,65536,1048576,16777216 --plot "$OUT/transfer.png" > /dev/null
$PW bench collectives --processes 2,4 --sizes 8,65536,1048576,16777216 \
  --plot "$OUT/collectives.png" > /dev/null

$PW bench multitenant --seconds 5 --plot "$OUT/multitenant.png" > /dev/null

# Four tenants at shares 1:2:4:8 sharing island 0 of a pw up cluster (2 islands x 2 hosts x 2
# devices), each on all four of its devices, 1 MiB per shard, 16 calls in flight; a fifth on
# island 1.
ADDRESS=$($PW up --detach --islands 2 --hosts-per-island 2 --devices-per-host 2 | tail -1)
pids=()
share=1
for name in A B C D; do
  PW_CLUSTER=$ADDRESS .venv/bin/python python/tests/tenant_load.py "tenant-$name" 4 60 262144 0 \
    $share 16 &
  pids+=($!)
  share=$((share * 2))
done
PW_CLUSTER=$ADDRESS .venv/bin/python python/tests/tenant_load.py "tenant-E" 4 60 65536 1 &
pids+=($!)
sleep 8  # Past their compiles: the trace shows the steady state.
$PW trace --seconds 0.3 --out "$PW_STATE_DIR/figure9.json" --plot "$OUT/figure9.png"
if command -v chromium > /dev/null; then
  URL=$($PW dashboard --detach 2> "$PW_STATE_DIR/dashboard.err" | tail -1)
  DASH=$(sed -n 's/.*process \([0-9]*\) serves.*/\1/p' "$PW_STATE_DIR/dashboard.err")
  # Until a timeline window holds the tenants (the loaded machine answers slowly), then real
  # time for the page's second sample (its rates).
  .venv/bin/python - "$URL" <<'PY'
import json, sys, time, urllib.request
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    state = json.loads(urllib.request.urlopen(sys.argv[1] + "api/state", timeout=10).read())
    if len(set((state.get("timeline") or {}).get("tenants", {}).values())) >= 4:
        break
    time.sleep(0.5)
PY
  chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
    --timeout=8000 --window-size=1280,1000 --screenshot="$OUT/dashboard.png" \
    "$URL" > /dev/null 2>&1
  kill "$DASH"
fi
kill "${pids[@]}" 2> /dev/null || true
wait "${pids[@]}" 2> /dev/null || true
echo "figures: wrote $(ls "$OUT" | tr '\n' ' ')" >&2
