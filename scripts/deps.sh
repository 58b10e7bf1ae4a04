#!/usr/bin/env bash
# scripts/deps.sh — install Debian packages only when they are missing.
# Sourced by scripts/test.sh and scripts/demo.sh; nothing is downloaded
# from anywhere but the machine's configured Debian archive.

# ensure_packages PKG...: install the packages among PKG... that dpkg does
# not report as installed. Runs apt-get update at most once per call.
ensure_packages() {
    local missing=() p
    for p in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
            missing+=("$p")
        fi
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "tdist: installing missing Debian packages: ${missing[*]}"
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo="sudo"
        else
            echo "tdist: need root (or sudo) to install: ${missing[*]}" >&2
            return 1
        fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# The packages every build needs.
TDIST_BUILD_PACKAGES=(build-essential cmake ninja-build pkg-config libopenblas-dev)
