#!/usr/bin/env bash
# Build the documentation as CI does: the HTML site with every warning an error, then every
# code example of the pages and docstrings as a doctest. Needs `pip install ".[docs]"`.
# Usage: bash docs/build.sh [output folder, default docs/_build]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-docs/_build}"
# sphinx-build (not `python -m sphinx`, which puts the working directory first on sys.path):
# the pages import the installed package, which the checkout's unbuilt dignn_kernels/ folder
# would shadow after a plain `pip install .`.
export TRITON_INTERPRET=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
sphinx-build -W --keep-going -d "$out/doctrees" -b html docs "$out/html"
sphinx-build -W -d "$out/doctrees" -b doctest docs "$out/doctest"
