#!/usr/bin/env bash
# scripts/demo.sh — the main job: build tdist (Release) and train a small
# CNN on the handwritten digits with DDP on 4 local ranks, through the
# tdistrun launcher and the default backend (shared memory on one host).
#
# The data set is the one Debian's python3-sklearn ships
# (sklearn/datasets/data/digits.csv.gz); it is unpacked into the build
# directory. Nothing is downloaded from anywhere but Debian's packages.
#
#   TDIST_NPROC       ranks to start (default: 4)
#   TDIST_EPOCHS      epochs (default: 20)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/deps.sh
. "$here/scripts/deps.sh"
ensure_packages "${TDIST_BUILD_PACKAGES[@]}" python3-sklearn

build="$here/build/release"
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DTDIST_BUILD_TESTS=OFF -DTDIST_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target tdistrun train_digits

gz="$(dpkg -L python3-sklearn | grep '/sklearn/datasets/data/digits.csv.gz$' | head -n 1)"
[ -n "$gz" ] && [ -r "$gz" ] || { echo "demo.sh: digits.csv.gz not found in python3-sklearn" >&2; exit 1; }
gzip -dc "$gz" >"$build/digits.csv"

exec "$build/tools/tdistrun/tdistrun" --nproc-per-node "${TDIST_NPROC:-4}" \
     "$build/examples/train_digits" "$build/digits.csv" "${TDIST_EPOCHS:-20}"
