#!/usr/bin/env bash
# make demo: the paper's Figure 2 program, then the data-parallel MLP (examples/mlp_dp.py) with
# its gradient all-reduce spanning two worker processes, then the Transformer LM served from its
# live weights by another process while it trains (examples/lm/serve.py), on a local
# multi-process cluster of 2 islands x 2 hosts x 2 devices that this script starts (`pw up`) and
# stops (`pw down`).
set -euo pipefail
cd "$(dirname "$0")/.."
PW=${BUILD_DIR:-build}/bin/pw
export PW_STATE_DIR
PW_STATE_DIR=$(mktemp -d -t pathways-demo.XXXXXX)
cleanup() {
  "$PW" down >/dev/null 2>&1 || true
  rm -rf "$PW_STATE_DIR"
}
trap cleanup EXIT
echo "== pw up --islands 2 --hosts-per-island 2 --devices-per-host 2" >&2
address=$("$PW" up --detach --islands 2 --hosts-per-island 2 --devices-per-host 2 | tail -n 1)
export PW_CLUSTER=$address
echo "== the cluster at $address" >&2
"$PW" status
echo "== the paper's Figure 2 on it" >&2
"$PW" example figure2
echo "== a data-parallel MLP on a 4-device slice spanning both hosts of an island" >&2
.venv/bin/python examples/mlp_dp.py "$@"
echo "== a Transformer LM trained on island 0, served by another process (tenant 'serve') on island 1" >&2
.venv/bin/python examples/lm/serve.py --steps 40
echo "== the LM again: a checkpoint every 4 steps (written by the workers), host 1's worker killed after step 6, the last checkpoint restored onto the devices that remain" >&2
.venv/bin/python examples/lm/recover.py
