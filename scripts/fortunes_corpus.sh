#!/usr/bin/env bash
# scripts/fortunes_corpus.sh OUT — the main job's English text: every
# fortune file of Debian's `fortunes` package (/usr/share/games/fortunes,
# the plain text files, not the .dat indexes or links), in name order,
# joined into OUT. Installs nothing: scripts/demo.sh and scripts/test.sh
# install the package first.
set -euo pipefail
out="${1:?usage: fortunes_corpus.sh OUT}"
dir=/usr/share/games/fortunes
files=$(dpkg -L fortunes | grep "^$dir/[^/.]*$" | LC_ALL=C sort)
[ -n "$files" ] || { echo "fortunes_corpus.sh: no fortune files in the fortunes package" >&2; exit 1; }
for f in $files; do
    [ -f "$f" ] && [ ! -L "$f" ] && cat "$f"
done >"$out.tmp"
mv "$out.tmp" "$out"
