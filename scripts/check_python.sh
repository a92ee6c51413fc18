#!/usr/bin/env bash
# Checks the `rankwatch` Python package (collectors/python/rankwatch/) with Debian 12's mypy
# (strict, collectors/python/mypy.ini) and pyflakes, both installed by scripts/deps.sh and run
# by Debian's /usr/bin/python3 (the interpreter the package is built for, whatever python3 is
# first on PATH). Needs no build: the extension rankwatch._native is typed by
# rankwatch/_native.pyi. CI runs it first (.ci/run); docs/testing.md.
#
#   scripts/check_python.sh       exit 0 when both are clean, 1 on any finding, 2 when a tool is
#                                 missing
#
# pyflakes also reads collectors/python/examples/. mypy keeps its cache in
# ${BUILD_DIR:-build}/mypy-cache (a warm check takes about a second, a cold one a few).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

PYTHON=/usr/bin/python3
PKG=collectors/python/rankwatch
for module in mypy pyflakes; do
  if ! "$PYTHON" -c "import $module" 2>/dev/null; then
    echo "check_python: $module not found for $PYTHON: run scripts/deps.sh (Debian packages mypy, pyflakes3)" >&2
    exit 2
  fi
done

rc=0
echo "== mypy --strict $PKG"
MYPYPATH=collectors/python "$PYTHON" -m mypy --config-file collectors/python/mypy.ini \
  --cache-dir "${BUILD_DIR:-build}/mypy-cache" -p rankwatch || rc=1
echo "== pyflakes $PKG collectors/python/examples"
# pyflakes reads *.pyi only when named (a folder gives it the *.py files).
"$PYTHON" -m pyflakes "$PKG" "$PKG"/*.pyi collectors/python/examples || rc=1

if ((rc)); then
  echo "check_python: findings above (docs/testing.md, 'Checks')" >&2
else
  echo "check_python: mypy and pyflakes clean"
fi
exit $rc
