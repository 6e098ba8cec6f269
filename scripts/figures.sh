#!/usr/bin/env bash
# `make figures`: the README's pictures, regenerated from runs on this machine (docs/images/).
#   dispatch.png     pw bench dispatch --plot (embedded cluster)
#   transfer.png     pw bench transfer --plot (ICI and DCN paths beside memcpy and raw TCP)
#   collectives.png  pw bench collectives --plot (2 and 4 worker processes)
#   figure9.png      pw trace --plot of four tenants sharing a pw up cluster (as the paper's Fig. 9)
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

# Four tenants sharing island 0 of a pw up cluster (2 islands x 2 hosts x 2 devices), each on
# all four of its devices, 1 MiB per shard; a fifth on island 1.
ADDRESS=$($PW up --detach --islands 2 --hosts-per-island 2 --devices-per-host 2 | tail -1)
pids=()
for name in A B C D; do
  PW_CLUSTER=$ADDRESS .venv/bin/python python/tests/tenant_load.py "client $name" 4 60 262144 0 &
  pids+=($!)
done
PW_CLUSTER=$ADDRESS .venv/bin/python python/tests/tenant_load.py "client E" 4 60 65536 1 &
pids+=($!)
sleep 8  # Past their compiles: the trace shows the steady state.
$PW trace --seconds 0.3 --out "$PW_STATE_DIR/figure9.json" --plot "$OUT/figure9.png"
if command -v chromium > /dev/null; then
  URL=$($PW dashboard --detach 2> "$PW_STATE_DIR/dashboard.err" | tail -1)
  DASH=$(sed -n 's/.*process \([0-9]*\) serves.*/\1/p' "$PW_STATE_DIR/dashboard.err")
  sleep 5  # Two timeline windows.
  chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
    --timeout=5000 --window-size=1280,1000 --screenshot="$OUT/dashboard.png" \
    "$URL" > /dev/null 2>&1
  kill "$DASH"
fi
kill "${pids[@]}" 2> /dev/null || true
wait "${pids[@]}" 2> /dev/null || true
echo "figures: wrote $(ls "$OUT" | tr '\n' ' ')" >&2
