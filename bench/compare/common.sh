# shellcheck shell=bash
# bench/compare/common.sh — what the comparison scripts (run.sh, ddp.sh)
# share: installing missing Debian packages and building tdist in Release.
# Sourced; uses the caller's die().

# install_missing PKG...: install the packages that are not installed
# (root only; one apt-get update and a retry if the install fails).
install_missing() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" = 0 ] || die "missing packages ${missing[*]}; as root: apt-get install -y --no-install-recommends ${missing[*]}"
    echo "# installing ${missing[*]}" >&2
    apt_install() {
        timeout -k 30 1800 apt-get -o DPkg::Lock::Timeout=600 install -y \
            --no-install-recommends "${missing[@]}" >&2
    }
    if ! apt_install; then
        timeout -k 30 900 apt-get -o DPkg::Lock::Timeout=600 update >&2 || true
        apt_install || die "apt-get install ${missing[*]} failed"
    fi
}

# build_tdist REPO BUILD LOG TRIES TARGET...: configure BUILD (Release, no
# tests) and build the targets; the tree may be mid-edit by someone else,
# so a failure is retried TRIES times, 60 s apart. Every step is bounded.
build_tdist() {
    local repo=$1 build=$2 log=$3 tries=$4 try
    shift 4
    mkdir -p "$(dirname "$log")"
    for ((try = 1; try <= tries; try++)); do
        if timeout -k 10 600 cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
            -DTDIST_BUILD_TESTS=OFF >"$log" 2>&1 &&
            timeout -k 10 1200 ninja -C "$build" "$@" >>"$log" 2>&1; then
            return 0
        fi
        echo "# tdist build failed (try $try of $tries; the tree may be mid-edit), see" \
            "$log; retrying in 60 s" >&2
        [ "$try" -lt "$tries" ] && sleep 60
    done
    die "tdist build failed $tries times"
}
