#!/usr/bin/env bash
# tests/docs/check_env_doc.sh SOURCE_DIR — every TDIST_* environment
# variable the library, the tools and the scripts read appears (as
# `NAME`) in docs/getting-started.md's environment table. Reads files only.
set -euo pipefail
src="${1:?usage: check_env_doc.sh SOURCE_DIR}"
doc="$src/docs/getting-started.md"
[[ -f "$doc" ]] || { echo "FAIL: $doc is missing"; exit 1; }
# getenv("TDIST_X"), tdist__env_int("TDIST_X", ...), #define VAR "TDIST_X",
# and ${TDIST_X...} in the scripts
vars=$( { grep -rhoE '(getenv|tdist__env_[a-z]+)\("TDIST_[A-Z0-9_]+"' "$src/src" "$src/tools" "$src/bench" || true
          grep -rhoE '#define [A-Z_]+ "TDIST_[A-Z0-9_]+"' "$src/src" "$src/tools" || true
          grep -rhoE '\$\{TDIST_[A-Z0-9_]+:-' "$src/scripts" || true
        } | grep -oE 'TDIST_[A-Z0-9_]+' | sort -u)
[[ -n "$vars" ]] || { echo "FAIL: found no TDIST_* variable in the sources (pattern broken?)"; exit 1; }
missing=0
for v in $vars; do
    if ! grep -qF "\`$v\`" "$doc"; then
        echo "FAIL: $v is read by the code but not documented in docs/getting-started.md"
        missing=$((missing + 1))
    fi
done
n=$(echo "$vars" | wc -w)
if ((missing)); then echo "$missing of $n variables undocumented"; exit 1; fi
echo "PASS: all $n TDIST_* variables are documented"
