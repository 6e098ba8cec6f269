#!/usr/bin/env bash
# Installs what building, testing and running pathways needs on Debian 12:
# Debian packages with apt-get, Python packages with pip into .venv at the repo root.
# Idempotent: skips apt-get when every package is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."

DEB_PACKAGES=(
  build-essential cmake ninja-build pkg-config python3 python3-venv
  libabsl-dev libopenblas-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev libgoogle-perftools-dev valgrind
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc iproute2
  iptables libnetfilter-queue-dev  # The multi-host test adds DCN latency where tc netem is absent.
  clang-14 libclang-rt-14-dev  # libFuzzer targets (make fuzz; a short run in make test).
  libssl-dev openssl  # TLS: the bulk stream (OpenSSL), scripts/tls-certs.sh.
  prometheus-cpp-dev  # Metrics endpoints (pw/metrics).
  libzstd-dev  # Checkpoints: stock Orbax writes zstd-compressed zarr chunks (pw/checkpoint).
  chromium  # The dashboard's test loads its page headless (pw/dashboard).
)

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: apt-get install ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >&2
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if [ -f requirements.txt ]; then
  .venv/bin/pip install -q -r requirements.txt >&2
fi
