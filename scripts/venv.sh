#!/usr/bin/env bash
# Makes the Python environment the tests, the demo and the benchmarks run PyTorch jobs in: a
# virtual environment on Debian's /usr/bin/python3 (the interpreter the `rankwatch` extension is
# built for) with --system-site-packages, so that Debian's grpcio, protobuf, confluent-kafka,
# selenium, numpy and yaml stay visible, and what tests/requirements.txt pins: PyTorch (a CPU
# wheel: on this project's machines pip takes it from the local wheel folder in seconds; an
# unpinned `torch` would download a CUDA build of several GB), and the training frameworks whose
# schedules the tests run (megatron-core, deepspeed). Idempotent and non-interactive: it prints
# the interpreter's path and does nothing more when the environment already has every pinned
# version.
#
#   scripts/venv.sh            .venv/ at the repository root (RANKWATCH_VENV=DIR elsewhere)
#
# rankwatch needs PyTorch 2.x (docs/collectors.md says why); the tests run on exactly this one.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RANKWATCH_VENV:-$PWD/.venv}
REQUIREMENTS=$PWD/tests/requirements.txt
TORCH_VERSION=$(sed -n 's/^torch==//p' "$REQUIREMENTS")

has_torch() {
  "$VENV/bin/python" - "$TORCH_VERSION" <<'EOF' 2>/dev/null
import sys
import torch
sys.exit(0 if torch.__version__.split("+")[0] == sys.argv[1] else 1)
EOF
}

# Whether every `name==version` of tests/requirements.txt is installed at that version.
has_requirements() {
  "$VENV/bin/python" - "$REQUIREMENTS" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import PackageNotFoundError, version
for line in open(sys.argv[1]):
    name, _, want = line.split("#")[0].strip().partition("==")
    if not name:
        continue
    try:
        if version(name.strip()).split("+")[0] != want.strip():
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
EOF
}

if [[ ! -x $VENV/bin/python ]]; then
  echo "venv: creating $VENV on /usr/bin/python3" >&2
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
if ! has_torch || ! has_requirements; then
  echo "venv: installing tests/requirements.txt (torch==$TORCH_VERSION, CPU) into $VENV" >&2
  find_links=()
  # The wheel folder of this project's machines (pip's own configuration names it too).
  [[ -d /opt/wheels ]] && find_links=(--find-links /opt/wheels)
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${find_links[@]}" \
    -r "$REQUIREMENTS"
  has_torch || { echo "venv: torch $TORCH_VERSION did not install into $VENV" >&2; exit 1; }
fi
echo "$VENV/bin/python"
