#!/usr/bin/env bash
# tests/docs/check_no_tracker_numbers.sh SOURCE_DIR [PATH...] — the docs,
# headers, sources, tools, tests, benchmarks and scripts speak of the
# project, never of the project's own tracker: no "issue N", "issues N-M",
# "session N", "ticket N", "milestone N" (also glued, as in a name like
# issueN_targets), and no bare tracker ids: "(#N)", "[#N]", "fixes #N",
# "see #N", "PR #N", "gh-N". References to other projects stay allowed:
# owner/repo#N and URLs (https://github.com/owner/repo/issues/N) are
# removed from a line before it is checked. PATHs (relative to SOURCE_DIR)
# default to README.md docs include src tools nn examples bench tests
# scripts. Prints file:line: text for every hit and fails if there is one.
#
# The checker first runs on a small tree it writes itself, with lines it
# must flag and lines it must let through, so a pattern that stopped
# matching fails the test instead of passing it. Reads files only (and
# writes that tree under a temporary directory).
set -euo pipefail
src="${1:?usage: check_no_tracker_numbers.sh SOURCE_DIR [PATH...]}"
shift

# Our tracker's words followed by a number: "issue N", "Session #N",
# "issues N", "issueN_targets", "ticket no. N".
words='\b(issue|session|ticket|milestone)s?([ _-]*#?|[ ]+(no\.?|number)[ ]*)[0-9]+'
# Bare ids: "(#N)", "[#N]", "#N" opening a line, "fixes #N", "PR #N", "gh-N".
bare='(^|[[(])#[0-9]+\b|\b(fix(es|ed)?|close[sd]?|resolve[sd]?|see|refs?|pr|pull request|bug)[ :]+#[0-9]+|\bgh-[0-9]+\b'
pattern="$words|$bare"

# What is allowed on a line, removed before the check: URLs and owner/repo#N.
strip_allowed() {
    sed -E -e 's#[A-Za-z][A-Za-z0-9+.-]*://[^][:space:]()<>"'"'"'`]*##g' \
           -e 's#[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+\#[0-9]+##g'
}

# check DIR PATH... : print "path:line: text" for every hit under DIR.
check() {
    local dir="$1"
    shift
    local paths=() p
    for p in "$@"; do [[ -e "$dir/$p" ]] && paths+=("$p"); done
    ((${#paths[@]})) || return 0
    # Candidates first (fast), then each one again without its allowed parts.
    (cd "$dir" && grep -rnIiE -- "$pattern" "${paths[@]}" || true) |
        while IFS= read -r hit; do
            local where="${hit%%:*}" rest="${hit#*:}"
            local line="${rest%%:*}" text="${rest#*:}"
            if printf '%s\n' "$text" | strip_allowed | grep -qiE -- "$pattern"; then
                printf '%s:%s: %s\n' "$where" "$line" "$text"
            fi
        done
}

# --- the checker on lines whose verdict is known
tmp="$(mktemp -d /tmp/tdist-tracker-check-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/docs" "$tmp/src"
# '@' stands for a digit, so that this file does not flag itself.
flag=(
    'the fingerprint mismatch of issue @ fails'
    '(interface selection is Issue @).'
    'Until session @ this was a spin'
    'RESULT issue@_targets_met 5 count'
    'as agreed in issues @ and @'
    'see ticket no. @@'
    'fixed in milestone @'
    'this works since (#@@)'
    'Fixes #@'
    'see PR #@@ for the numbers'
    'gh-@@ again'
)
allow=(
    'PyTorch does the same (pytorch/pytorch#75666).'
    'https://github.com/pytorch/pytorch/issues/75666 explains it'
    'see https://example.org/session/@ and https://x.org/a#@@'
    'p2p mismatch: rank 0 sent #1 send(f32, 10)'
    '#include <stdio.h>'
    'ranks issue their collectives in one order'
    'the issue is that every session needs a store'
    'issue_count = 3'
)
printf '%s\n' "${flag[@]}" | tr '@' '7' >"$tmp/docs/flag.md"
printf '%s\n' "${allow[@]}" | tr '@' '7' >"$tmp/src/allow.c"
found="$(check "$tmp" docs src)"
bad=0
for ((i = 0; i < ${#flag[@]}; i++)); do
    if ! grep -qF "docs/flag.md:$((i + 1)): " <<<"$found"; then
        echo "FAIL: the checker misses \"$(tr '@' '7' <<<"${flag[i]}")\""
        bad=1
    fi
done
if grep -F "src/allow.c:" <<<"$found"; then
    echo "FAIL: the checker flags the allowed lines above"
    bad=1
fi
((bad == 0)) || exit 1

# --- the tree
if (($# == 0)); then set -- README.md docs include src tools nn examples bench tests scripts; fi
found="$(check "$src" "$@")"
if [[ -n "$found" ]]; then
    printf '%s\n' "$found"
    echo "FAIL: $(wc -l <<<"$found") line(s) cite the project's own tracker (issue or session" \
         "numbers); say what the thing is instead (references to other projects as owner/repo#N" \
         "or URLs are fine)"
    exit 1
fi
echo "PASS: no tracker numbers in $*"
