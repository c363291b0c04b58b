#!/usr/bin/env bash
# Fails, naming each file, when a C++ file of the tree is not what clang-format
# makes of it under the tree's .clang-format (Google style, 100 columns).
# Usage: check_format.sh <kdm source dir>
# Fix with: clang-format -i $(git ls-files '*.cc' '*.h')
set -euo pipefail
cd "$1"
if ! command -v clang-format >/dev/null; then
  echo "clang-format is not installed (./run deps installs it)" >&2
  exit 1
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cc' '*.h')
else
  mapfile -t files < <(find . -path ./build\* -prune -o \( -name '*.cc' -o -name '*.h' \) -print)
fi
if [ ${#files[@]} -eq 0 ]; then
  echo "no C++ files found under $1" >&2
  exit 1
fi
bad=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  if ! clang-format --style=file "$f" | cmp -s - "$f"; then
    bad+=("$f")
  fi
done
if [ ${#bad[@]} -gt 0 ]; then
  printf 'not clang-formatted: %s\n' "${bad[@]}" >&2
  echo "${#bad[@]} of ${#files[@]} files differ; run: clang-format -i <file>" >&2
  exit 1
fi
echo "${#files[@]} files are clang-formatted"
