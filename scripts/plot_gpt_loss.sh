#!/usr/bin/env bash
# scripts/plot_gpt_loss.sh LOG OUT.png — the loss curve of a train_gpt run:
# the training loss of its plain progress lines ("it N/M loss X ...") and
# the validation losses ("val_loss at iteration N: X"), with the unigram
# baseline ("unigram baseline: val_loss=X"), drawn by gnuplot (Debian's
# gnuplot-nox, installed when missing). docs/gpt-loss.png was made by
#   TDIST_GPT_ARGS="--log-every 5" ./scripts/demo.sh | tee demo.log
#   scripts/plot_gpt_loss.sh demo.log docs/gpt-loss.png
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log="${1:?usage: plot_gpt_loss.sh LOG OUT.png}" out="${2:?usage: plot_gpt_loss.sh LOG OUT.png}"
# shellcheck source=scripts/deps.sh
. "$here/scripts/deps.sh"
ensure_packages gnuplot-nox
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed -n 's/.* it \([0-9]*\)\/[0-9]* loss \([0-9.]*\) .*/\1 \2/p' "$log" >"$tmp/train"
sed -n 's/.*val_loss at iteration \([0-9]*\): \([0-9.]*\).*/\1 \2/p' "$log" >"$tmp/val"
uni=$(sed -n 's/.*unigram baseline: val_loss=\([0-9.]*\).*/\1/p' "$log" | head -n 1)
[ -s "$tmp/train" ] && [ -s "$tmp/val" ] && [ -n "$uni" ] ||
    { echo "plot_gpt_loss.sh: no plain progress lines, validation losses or baseline in $log" >&2; exit 1; }
ranks=$(sed -n 's/.*train_gpt: \([0-9]*\) ranks;.*/\1/p' "$log" | head -n 1)
gnuplot <<GP
set terminal png size 900,540 font ",11" noenhanced
set output "$out"
set title "train_gpt: byte-level GPT on Debian's fortunes, ${ranks:-?} ranks, DDP under Join"
set xlabel "iteration"
set ylabel "cross-entropy (nats per byte)"
set grid
set key top right
plot "$tmp/train" using 1:2 with lines lw 1 lc rgb "#7f9fcf" title "training loss (mean over active ranks)", \
     "$tmp/val" using 1:2 with linespoints lw 2 pt 7 lc rgb "#c03020" title "validation loss", \
     $uni with lines dt 2 lw 2 lc rgb "#404040" title "unigram baseline ($uni)"
GP
echo "plot_gpt_loss.sh: wrote $out"
