#!/usr/bin/env bash
# Installs the Debian packages nvio needs that are missing. As root it runs apt-get; otherwise it
# prints the exact command to run and exits non-zero. Sourced by quickstart.sh and test.sh.
set -euo pipefail

NVIO_PACKAGES=(
  build-essential cmake pkg-config
  liburing-dev libaio-dev libisal-dev zlib1g-dev libxxhash-dev
  libfmt-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev
  python3 python3-dev python3-pytest pybind11-dev
  python3-numpy python3-torch python3-setuptools python3-wheel python3-venv
  python3-matplotlib
  fio e2fsprogs xfsprogs
  clang libclang-rt-14-dev
)

missing=()
for pkg in "${NVIO_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "nvio: missing Debian packages: ${missing[*]}" >&2
  echo "nvio: run as root:  apt-get update && $cmd" >&2
  exit 1
fi
echo "nvio: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
$cmd -qq
