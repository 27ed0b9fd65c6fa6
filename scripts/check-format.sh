#!/usr/bin/env bash
# Checks every tracked C++ file against .clang-format (Debian 12's clang-format 14, which
# scripts/install-deps.sh installs); lists the files that differ and exits 1 when any does.
# `scripts/check-format.sh --fix` rewrites them in place instead.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cpp' '*.hpp')
if [[ ${1:-} == --fix ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
status=0
for f in "${files[@]}"; do
  if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "check-format: $f differs from .clang-format (scripts/check-format.sh --fix)"
    status=1
  fi
done
exit $status
