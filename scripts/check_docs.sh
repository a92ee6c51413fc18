#!/usr/bin/env bash
# Checks the size limits of the documents that grow with every run: benchmarks/README.md holds
# today's figure of each benchmark with its command, in at most 300 lines (earlier runs are in
# git: `git log -p benchmarks/README.md`). Needs no build; CI runs it with the other checks
# (.ci/run); docs/testing.md.
#
#   scripts/check_docs.sh    exit 0 when every document is within its limit, 1 otherwise
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

# document, most lines
LIMITS=(
  "benchmarks/README.md 300"
)

rc=0
for entry in "${LIMITS[@]}"; do
  read -r doc most <<<"$entry"
  if [[ ! -f "$doc" ]]; then
    echo "check_docs: $doc not found" >&2
    rc=1
    continue
  fi
  lines=$(wc -l <"$doc")
  if ((lines > most)); then
    echo "check_docs: $doc has $lines lines, more than $most: keep today's run of each" \
      "benchmark and leave earlier runs to git history" >&2
    rc=1
  fi
done
((rc)) || echo "check_docs: every document within its limit"
exit $rc
