#!/usr/bin/env bash
# Checks that every C/C++ source and header of the repository is formatted as `.clang-format`
# says, with Debian 12's clang-format-14 (installed by scripts/deps.sh; another version may
# format differently, so no other is used). CI runs it first (.ci/run); docs/testing.md.
#
#   scripts/check_format.sh          lists the files that differ, with the command that fixes
#                                    each; exit 1 when any differs, 0 when none does
#   scripts/check_format.sh --fix    reformats those files in place (clang-format-14 -i)
#   scripts/check_format.sh [--fix] FILE...   only these files
#
# The files: the *.h, *.cc, *.c, *.cpp, *.hpp that git knows, tracked or untracked but not
# ignored (a new file is checked before it is added), under every folder. Nothing is excluded:
# the tree holds no vendored or generated C/C++ (generated code lands in build*/, which
# .gitignore ignores). The .proto files are not C/C++ and are left alone.
# Exit status: 0 clean (or fixed), 1 a file differs, 2 clang-format-14 missing or bad usage.
set -euo pipefail
cd "$(dirname "$0")/.."

CLANG_FORMAT=clang-format-14
FIX=0
FILES=()
for a in "$@"; do
  case "$a" in
    --fix) FIX=1 ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "check_format: unknown option $a (--fix, FILE...)" >&2; exit 2 ;;
    *) FILES+=("$a") ;;
  esac
done

if ! command -v "$CLANG_FORMAT" >/dev/null; then
  echo "check_format: $CLANG_FORMAT not found: run scripts/deps.sh (Debian package clang-format-14)" >&2
  exit 2
fi

if ((${#FILES[@]} == 0)); then
  while IFS= read -r -d '' f; do
    [[ -f "$f" ]] && FILES+=("$f")  # a tracked file deleted in the work tree is skipped
  done < <(git ls-files -z --cached --others --exclude-standard -- \
             '*.h' '*.cc' '*.c' '*.cpp' '*.hpp' | sort -zu)
fi
if ((${#FILES[@]} == 0)); then
  echo "check_format: no C/C++ files found" >&2
  exit 2
fi

# One clang-format process per file, two at a time: a file that differs is printed by name.
# --ferror-limit=1 stops at a file's first difference; the name is all this needs.
# shellcheck disable=SC2016  # $0 and $1 are the inner shell's
mapfile -t DIFFERING < <(printf '%s\0' "${FILES[@]}" | xargs -0 -n1 -P2 sh -c \
  '"$0" --dry-run -Werror --ferror-limit=1 "$1" >/dev/null 2>&1 || printf "%s\n" "$1"' \
  "$CLANG_FORMAT" | sort)

if ((${#DIFFERING[@]} == 0)); then
  echo "check_format: ${#FILES[@]} C/C++ file(s) checked, none differs from .clang-format"
  exit 0
fi

if ((FIX)); then
  "$CLANG_FORMAT" -i "${DIFFERING[@]}"
  printf 'check_format: reformatted %s\n' "${DIFFERING[@]}"
  exit 0
fi

echo "check_format: ${#DIFFERING[@]} of ${#FILES[@]} C/C++ file(s) differ from .clang-format:"
for f in "${DIFFERING[@]}"; do
  echo "  $f    (fix: $CLANG_FORMAT -i $f)"
done
echo "check_format: to see a difference: $CLANG_FORMAT FILE | diff FILE -; to fix all: scripts/check_format.sh --fix"
exit 1
