#!/usr/bin/env bash
# Installs the Debian packages rankwatch builds, tests and demos with. Idempotent and
# non-interactive: only packages that are missing are installed; `apt-get update` runs once,
# and only when something is missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config ccache git
  librdkafka-dev libprotobuf-dev protobuf-compiler
  libgrpc++-dev protobuf-compiler-grpc
  librocksdb-dev libsimdjson-dev zlib1g-dev libzstd-dev libjemalloc-dev
  libcli11-dev libyaml-cpp-dev libspdlog-dev libfmt-dev
  libcpp-httplib-dev libssl-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  kcat prometheus prometheus-alertmanager curl
  python3 python3-grpcio python3-protobuf python3-confluent-kafka python3-yaml
  python3-dev pybind11-dev python3-numpy
  python3-venv python3-build python3-setuptools python3-wheel
  chromium chromium-driver python3-selenium
)
# The checks CI runs before building (scripts/check_format.sh, scripts/check_python.sh); not
# needed to build, so the container image's build stage leaves them out.
PACKAGES+=(clang-format-14 mypy pyflakes3)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "deps: installing ${missing[*]}" >&2
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
