#!/usr/bin/env bash
# scripts/demo.sh — the main job: build tdist (Release) and train a small
# GPT (examples/train_gpt.c, nn's llm.c-style transformer) byte by byte on
# English text, with DDP under Join on 4 local ranks, through the tdistrun
# launcher and the default backend (shared memory on one host).
#
# The text is Debian's fortunes package (about 2.5 MB of quotations,
# jokes and verse), joined into one file in the build directory by
# scripts/fortunes_corpus.sh. Nothing is downloaded from anywhere but
# Debian's packages.
#
#   TDIST_NPROC       ranks to start (default: 4)
#   TDIST_STEPS       iterations (default: 400)
#   TDIST_GPT_ARGS    more train_gpt options, e.g. "--hook bf16 --checkpoint-activations"
#
# On a terminal the last rank draws a progress bar; otherwise it prints a
# line every 25 iterations. A checkpoint goes to build/release/gpt.ckpt
# every 100 iterations (TDIST_GPT_ARGS="--resume" continues from it),
# except with --local-sgd or --diloco, which train_gpt cannot checkpoint.
# The digits example keeps its own command: see docs/getting-started.md.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/deps.sh
. "$here/scripts/deps.sh"
ensure_packages "${TDIST_BUILD_PACKAGES[@]}" fortunes

build="$here/build/release"
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DTDIST_BUILD_TESTS=OFF -DTDIST_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target tdistrun train_gpt

bash "$here/scripts/fortunes_corpus.sh" "$build/fortunes.txt"

launcher=()
if [ -t 1 ]; then
    export TDIST_PROGRESS=bar
    launcher=(--no-prefix)
fi
ckpt=(--ckpt "$build/gpt.ckpt" --ckpt-every 100)
case " ${TDIST_GPT_ARGS:-} " in
    *" --local-sgd "* | *" --diloco "*) ckpt=() ;;
esac
# shellcheck disable=SC2086 # TDIST_GPT_ARGS is a list of options
exec "$build/tools/tdistrun/tdistrun" --nproc-per-node "${TDIST_NPROC:-4}" "${launcher[@]}" \
     "$build/examples/train_gpt" "$build/fortunes.txt" --steps "${TDIST_STEPS:-400}" \
     --log-every 25 "${ckpt[@]}" ${TDIST_GPT_ARGS:-}
