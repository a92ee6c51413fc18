#!/usr/bin/env bash
# Checks the `rankwatch` Python package (collectors/python/rankwatch/) with Debian 12's mypy
# (strict, collectors/python/mypy.ini), and every Python file of the repository with pyflakes,
# both installed by scripts/deps.sh and run by Debian's /usr/bin/python3 (the interpreter the
# package is built for, whatever python3 is first on PATH). Needs no build: the extension
# rankwatch._native is typed by rankwatch/_native.pyi. CI runs it first (.ci/run);
# docs/testing.md.
#
#   scripts/check_python.sh       exit 0 when both are clean, 1 on any finding, 2 when a tool is
#                                 missing
#
# pyflakes reads the *.py and *.pyi files that git knows, tracked or untracked but not ignored
# (package, collectors, tests, benchmarks, scripts, deploy, fixtures' generators); generated
# Python (protobuf stubs) and .venv/ land in ignored folders. mypy keeps its cache in
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
PY_FILES=()
while IFS= read -r -d '' f; do
  [[ -f "$f" ]] && PY_FILES+=("$f")  # a tracked file deleted in the work tree is skipped
done < <(git ls-files -z --cached --others --exclude-standard -- '*.py' '*.pyi' | sort -zu)
echo "== pyflakes: ${#PY_FILES[@]} Python files"
if ((${#PY_FILES[@]} == 0)); then
  echo "check_python: git lists no Python file (not a git checkout?)" >&2
  rc=1
else
  "$PYTHON" -m pyflakes "${PY_FILES[@]}" || rc=1
fi

if ((rc)); then
  echo "check_python: findings above (docs/testing.md, 'Checks')" >&2
else
  echo "check_python: mypy and pyflakes clean"
fi
exit $rc
