#!/usr/bin/env bash
# Stages the real graphs that bench/gpu_session.sh reads (cornell5, Cora, chameleon, amherst41;
# about 5.4 MB) for a GPU machine: a device call sends the repository's working tree, not the
# shared data folder beside it, and takes an ignored folder along only when the call names it.
# This copies the datasets into ./.bench_data (where gpu_session.sh looks after ./shared/data)
# and lists that folder in .git/info/exclude, so that it is never committed. Then run
#
#   bash bench/gpu_session.sh            with carry [".bench_data"] in the device call
#
# Usage: bash bench/stage_gpu_data.sh [source]   (default $DIGNN_DATA, else ../shared/data)
set -euo pipefail
cd "$(dirname "$0")/.."
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
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qxF '.bench_data/' "$exclude" 2>/dev/null || echo '.bench_data/' >> "$exclude"
du -sh .bench_data
exit "$missing"
