#!/usr/bin/env bash
# Stages the real graphs that bench/gpu/gpu_session.sh reads (cornell5, Cora, chameleon, amherst41;
# about 5.4 MB) for a GPU machine: a device call sends the repository's working tree, not the
# shared data folder beside it, and takes an ignored folder along only when the call names it.
# This copies the datasets into ./.bench_data (where gpu_session.sh looks after ./shared/data)
# and lists that folder in .git/info/exclude, so that it is never committed. Then run
#
#   bash bench/gpu/gpu_session.sh            with carry [".bench_data"] in the device call
#
# The peers phase (bench/peers/peers.py) also needs, where it is to run them, what the GPU machine
# cannot download: a checkout of the authors' code (github.com/guoji-fu/DIGNN; its Python
# sources are copied from $DIGNN_AUTHORS into .bench_data/authors_dignn, never committed) and
# torchdeq's wheel (pip download into .bench_data/wheels; the session installs it from there).
# Without them the peers phase records those peers as absent.
#
# Usage: [DIGNN_AUTHORS=<checkout>] bash bench/gpu/stage_gpu_data.sh [source]
#        (source: default $DIGNN_DATA, else ../shared/data)
set -euo pipefail
cd "$(dirname "$0")/../.."
src="${1:-${DIGNN_DATA:-../shared/data}}"
mkdir -p .bench_data
missing=0
for name in cornell5 Cora chameleon amherst41; do
  if [ -d "$src/$name/raw" ]; then
    rm -rf ".bench_data/$name"
    cp -r "$src/$name" .bench_data/
  else
    echo "missing: $src/$name/raw (the GPU session skips what needs it)" >&2
    missing=1
  fi
done
if [ -n "${DIGNN_AUTHORS:-}" ]; then
  if [ -f "$DIGNN_AUTHORS/nodeclassification/src/layers.py" ]; then
    rm -rf .bench_data/authors_dignn
    mkdir -p .bench_data/authors_dignn
    (cd "$DIGNN_AUTHORS" && find nodeclassification graphclassification -name '*.py' \
       -not -path '*/__pycache__/*' -print0 2>/dev/null) |
      while IFS= read -r -d '' f; do
        mkdir -p ".bench_data/authors_dignn/$(dirname "$f")"
        cp "$DIGNN_AUTHORS/$f" ".bench_data/authors_dignn/$f"
      done
    commit="$(git -C "$DIGNN_AUTHORS" rev-parse HEAD 2>/dev/null || cat "$DIGNN_AUTHORS/.commit" 2>/dev/null || echo unknown)"
    echo "$commit" > .bench_data/authors_dignn/.commit
  else
    echo "DIGNN_AUTHORS=$DIGNN_AUTHORS has no nodeclassification/src/layers.py: the peers phase will record the authors' layer as absent" >&2
  fi
else
  echo "DIGNN_AUTHORS not set: the peers phase will record the authors' layer as absent" >&2
fi
mkdir -p .bench_data/wheels
if ! ls .bench_data/wheels/torchdeq-*.whl >/dev/null 2>&1; then
  python3 -m pip download --quiet --no-deps torchdeq==0.1.0 -d .bench_data/wheels ||
    echo "torchdeq's wheel could not be downloaded: the peers phase will record torchdeq as absent" >&2
fi
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qxF '.bench_data/' "$exclude" 2>/dev/null || echo '.bench_data/' >> "$exclude"
du -sh .bench_data
exit "$missing"
