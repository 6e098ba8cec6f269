#!/bin/bash
# `pw bench transfer --json` starts its own controller and worker and prints one JSON object with
# an ICI and a DCN result per size (ctest GrpcClusterBenchTransfer; a smoke test, not a timing).
set -euo pipefail
PW=${1:?usage: bench-transfer-smoke-test.sh PATH_TO_PW}
"$PW" bench transfer --json --sizes 4096,1048576 --min-seconds 0.02 | python3 -c '
import json, sys
results = json.load(sys.stdin)["results"]
got = sorted((r["path"], r["bytes"]) for r in results)
want = sorted((p, b) for p in ("ici", "dcn") for b in (4096, 1048576))
assert got == want, got
assert all(r["pathways_bytes_per_second"] > 0 for r in results), results
print("bench transfer: OK")'
