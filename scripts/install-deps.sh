#!/usr/bin/env bash
# Installs the Debian packages luapipe needs, only those that are missing.
# Idempotent and fast when everything is present.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  lua5.4 liblua5.4-dev lua-unit lua-argparse lua-cjson
  lua-check # luacheck over lua/ (the cli_test_lint test)
  libcmocka-dev
  libopenmpi-dev openmpi-bin
  libopenblas-dev
  libdnnl-dev # oneDNN: bf16 GEMMs (optional at build time; CI has it)
  libreadline-dev
  libyajl-dev zlib1g-dev
  iproute2 # tests/mpi/test_two_hosts.sh: network namespaces (ip netns)
  munge slurmctld slurmd slurm-client # tests/cluster/test_slurm.sh: a real Slurm (as root)
)
# scripts/fuzz.sh also needs clang and libFuzzer (the build and tests do not)
if [ "${LUAPIPE_DEPS_FUZZ:-0}" = 1 ]; then PACKAGES+=(clang libclang-rt-dev); fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
