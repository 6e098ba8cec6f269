#!/usr/bin/env bash
# GPU checks, for machines with an NVIDIA GPU (CI has none, and does not run this).
#
# Installs JAX's CUDA 13 PJRT plugin (pinned to the jax version in requirements.txt, with the CUDA
# libraries as wheels) into .venv, then runs, with that plugin as the runtime's PJRT backend:
#   1. the paper's Figure 2 in Python (examples/figure2.py), which must print its output;
#   2. pw bench xla-overhead --json (pathways vs JAX dispatch, JAX also on the GPU).
# Finishes in well under 5 minutes once the wheels are cached. Results: $OUT (default gpu-check/).
#
# Runtime devices share the GPU's PJRT devices round-robin (pw/pjrt/pjrt_backend.h).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-check}"
mkdir -p "$OUT"

nvidia-smi -L || { echo "gpu-check: no NVIDIA GPU visible (nvidia-smi failed)" >&2; exit 2; }
[ -x .venv/bin/python ] || scripts/install-deps.sh
JAX_VERSION=$(.venv/bin/python -c "import jax; print(jax.__version__)")
.venv/bin/pip install -q "jax[cuda13]==${JAX_VERSION}"
PLUGIN=$(.venv/bin/python - <<'PY'
import pathlib, jax_plugins.xla_cuda13 as p
print(next(pathlib.Path(p.__file__).parent.glob("xla_cuda_plugin.so")))
PY
)
echo "gpu-check: CUDA PJRT plugin $PLUGIN" | tee "$OUT/plugin.txt"
[ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$(nproc)"
.venv/bin/pip install -q --no-build-isolation -e .

export PW_PJRT_PLUGIN="$PLUGIN" JAX_PLATFORMS=cuda
export PW_ISLANDS=1 PW_HOSTS_PER_ISLAND=1 PW_DEVICES_PER_HOST=2

echo "== Figure 2 on the GPU"
got=$(timeout 120 .venv/bin/python examples/figure2.py | tee "$OUT/figure2.txt")
want="(array([3., 5.]), array([2., 4.]))"
if [ "$got" != "$want" ]; then echo "gpu-check: figure2 printed '$got', want '$want'" >&2; exit 1; fi

echo "== xla-overhead on the GPU"
# JAX's own CUDA backend is the jax-cuda13-pjrt plugin, the same library as $PLUGIN: builtin.
PW_DEVICES_PER_HOST=1 timeout 150 build/bin/pw bench xla-overhead --json --min-seconds 0.5 \
  --sizes 64,256,1024,2048,4096 --jax-backend builtin > "$OUT/xla_overhead.json"
cat "$OUT/xla_overhead.json"
echo "gpu-check: OK"
