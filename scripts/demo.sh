#!/usr/bin/env bash
# scripts/demo.sh — the main job: build tdist (Release) and run the
# multi-rank example on 4 local ranks through the tdistrun launcher.
#
# For now the job is examples/launcher_hello: every rank joins through
# env:// rendezvous, checks in through the TCP store and rank 0 verifies all
# of them. The DDP training demo replaces it when the DDP layer lands.
#
#   TDIST_NPROC       ranks to start (default: 4)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/deps.sh
. "$here/scripts/deps.sh"
ensure_packages "${TDIST_BUILD_PACKAGES[@]}"

build="$here/build/release"
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DTDIST_BUILD_TESTS=OFF -DTDIST_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target tdistrun launcher_hello
exec "$build/tools/tdistrun/tdistrun" --nproc-per-node "${TDIST_NPROC:-4}" \
     "$build/examples/launcher_hello"
