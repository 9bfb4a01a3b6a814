#!/usr/bin/env bash
# Build, test and benchmark on a GPU machine in one call of at most 10 minutes, from the
# repository root:
#
#   1. record the device, driver, Python, torch, Triton and nvcc versions;
#   2. build and install the package: `pip install --no-build-isolation --no-deps .`;
#   3. run the GPU tests: `pytest -m cuda tests` (marker `cuda`);
#   4. run the GPU benchmark: bench/test_gpu_speed.py (pytest-benchmark JSON + summary);
#   5. time `dignn train` per epoch on the real datasets and the Penn94-shaped graph, per
#      backend (bench/gpu_epochs.py);
#   6. (mode `locality` only, a second call: it needs a few minutes of its own) locality
#      reordering on the products-sized block model with shuffled ids and on cornell5
#      (bench/test_locality.py -m cuda), after the sm_90 compile of every Triton kernel
#      variant with this machine's Triton: no register spills, each variant's registers
#      printed (tests/test_triton.py::test_kernels_compile_for_the_gpu).
#
# Everything lands in $OUT (the files that come back), named as they go under bench/results/:
#   gpu_<device>_run.json      device, versions, build time, test pass/fail/skip counts
#                              (gpu_<device>_<mode>_run.json for a mode other than all)
#   gpu_<device>.json          the pytest-benchmark JSON
#   gpu_<device>_summary.txt   the benchmark's table and every goal met or missed
#   gpu_<device>_epochs.json   ms per `dignn train` epoch per dataset and backend
#   gpu_<device>_locality.json the locality benchmark's pytest-benchmark JSON (mode locality)
#   gpu_<device>_locality_summary.txt  its goal (products-sized step <= 150 ms), met or missed
#   session.log (everything printed: tests, benchmarks, epochs), build.log
# and copies of the results under bench/results/ of the tree it ran in.
#
# Usage:  bash bench/gpu_session.sh [all|tests|bench|epochs|locality]  (default all; the others skip
#         the build when dignn_kernels with CUDA kernels is already installed)
# Data:   the real graphs (cornell5, Cora, chameleon, amherst41) are read from $DIGNN_DATA,
#         else ./shared/data, else ./.bench_data: `bash bench/stage_gpu_data.sh` fills that
#         folder from ../shared/data and lists it in .git/info/exclude; a device call takes it
#         along when its carry names ".bench_data". Graphs whose files are missing are skipped
#         and the summaries say so.
# Limits: BUILD_TIMEOUT, TESTS_TIMEOUT, BENCH_TIMEOUT, EPOCHS_TIMEOUT, KERNELS_TIMEOUT,
#         LOCALITY_TIMEOUT (seconds; default 200, 240, 170, 100, 90, 420: 296 GPU tests since
#         2026-11-24, where the first GPU run took 77 s for 149; the build takes about 40 s of
#         its 200; the compile check 31 s on a 2-core CPU).
set -x -o pipefail

MODE="${1:-all}"
OUT="${OUT:-$(mktemp -d)}"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
# Import the installed package, not the source tree in the working directory.
export PYTHONSAFEPATH=1
mkdir -p "$OUT"
exec > >(tee -a "$OUT/session.log") 2>&1

cd "$(dirname "$0")/.." || exit 1

if [ -z "${DIGNN_DATA:-}" ]; then
  for cand in shared/data .bench_data ../shared/data; do
    if [ -f "$cand/cornell5/raw/data.mat" ]; then
      DIGNN_DATA="$(cd "$cand" && pwd)"
      break
    fi
  done
fi
export DIGNN_DATA="${DIGNN_DATA:-$PWD/.bench_data}"

device_name="$($PY -c 'import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else "none")' 2>/dev/null)"
slug="$(echo "${device_name:-none}" | tr 'A-Z' 'a-z' | sed -E 's/nvidia //; s/[^a-z0-9]+/_/g; s/^_+|_+$//g')"
slug="${slug:-none}"

nvidia-smi || true
nvcc --version || true
$PY - <<'EOF' | tee "$OUT/versions.txt"
import platform, torch
print("python", platform.python_version())
print("torch", torch.__version__, "cuda", torch.version.cuda)
print("device", torch.cuda.get_device_name() if torch.cuda.is_available() else None)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("sm", f"{p.major}.{p.minor}", "multiprocessors", p.multi_processor_count,
          "memory_gb", round(p.total_memory / 2**30, 1))
try:
    import triton
    print("triton", triton.__version__)
except Exception as err:  # noqa: BLE001
    print("triton unavailable:", err)
EOF

have_build() {
  $PY -c 'import dignn_kernels, sys; sys.exit(0 if dignn_kernels._build_info.WITH_CUDA else 1)' \
    2>/dev/null
}

build_seconds=null
build_rc=0
if [ "$MODE" = "all" ] || ! have_build; then
  start=$(date +%s)
  timeout "${BUILD_TIMEOUT:-200}" $PY -m pip install --no-build-isolation --no-deps -v . \
    > "$OUT/build.log" 2>&1
  build_rc=$?
  build_seconds=$(( $(date +%s) - start ))
  tail -n 30 "$OUT/build.log"
  if [ "$build_rc" -ne 0 ]; then
    echo "BUILD FAILED (rc=$build_rc); see build.log"
  fi
fi
$PY -c 'import dignn_kernels as dk; print("installed:", dk.__file__, dk._build_info.CUDA_ARCHS, dk.available_backends(__import__("torch").device("cuda")))'

tests_rc=null
if [ "$build_rc" -eq 0 ] && { [ "$MODE" = "all" ] || [ "$MODE" = "tests" ]; }; then
  timeout "${TESTS_TIMEOUT:-240}" $PY -m pytest -m cuda tests -q -rs -p no:cacheprovider \
    --durations=25 \
    --junitxml="$OUT/tests.xml" 2>&1
  tests_rc=$?
fi

bench_rc=null
if [ "$build_rc" -eq 0 ] && { [ "$MODE" = "all" ] || [ "$MODE" = "bench" ]; }; then
  DIGNN_BENCH_SUMMARY="$OUT/gpu_${slug}_summary.txt" timeout "${BENCH_TIMEOUT:-170}" \
    $PY -m pytest bench/test_gpu_speed.py -q -s -rs -p no:cacheprovider \
    --benchmark-json "$OUT/gpu_${slug}.json" 2>&1
  bench_rc=$?
fi

epochs_rc=null
if [ "$build_rc" -eq 0 ] && { [ "$MODE" = "all" ] || [ "$MODE" = "epochs" ]; }; then
  timeout "${EPOCHS_TIMEOUT:-100}" $PY bench/gpu_epochs.py --out "$OUT" --device cuda 2>&1
  epochs_rc=$?
fi

kernels_rc=null
locality_rc=null
if [ "$build_rc" -eq 0 ] && [ "$MODE" = "locality" ]; then
  timeout "${KERNELS_TIMEOUT:-90}" $PY -m pytest tests/test_triton.py -q -s -p no:cacheprovider \
    -k test_kernels_compile_for_the_gpu 2>&1
  kernels_rc=$?
fi
if [ "$build_rc" -eq 0 ] && [ "$MODE" = "locality" ]; then
  DIGNN_LOCALITY_SUMMARY="$OUT/gpu_${slug}_locality_summary.txt" \
    timeout "${LOCALITY_TIMEOUT:-420}" $PY -m pytest bench/test_locality.py -m cuda -q -s -rs \
    -p no:cacheprovider --benchmark-json "$OUT/gpu_${slug}_locality.json" 2>&1
  locality_rc=$?
fi

run_name="gpu_${slug}_run.json"
[ "$MODE" = "all" ] || run_name="gpu_${slug}_${MODE}_run.json"
$PY - "$OUT" "$run_name" "$build_rc" "$build_seconds" "$tests_rc" "$bench_rc" "$epochs_rc" \
    "$kernels_rc" "$locality_rc" <<'EOF'
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path
(out, run_name, build_rc, build_s, tests_rc, bench_rc, epochs_rc, kernels_rc,
 locality_rc) = sys.argv[1:]
import torch
run = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
       "torch": torch.__version__, "cuda": torch.version.cuda,
       "build_rc": int(build_rc), "build_seconds": json.loads(build_s),
       "tests_rc": json.loads(tests_rc), "bench_rc": json.loads(bench_rc),
       "epochs_rc": json.loads(epochs_rc), "kernels_rc": json.loads(kernels_rc),
       "locality_rc": json.loads(locality_rc),
       "versions": Path(out, "versions.txt").read_text().splitlines()}
xml = Path(out, "tests.xml")
if xml.exists():
    suites = ET.parse(xml).getroot()
    suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
    total, fail, err, skip = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors",
                                                              "skipped"))
    run["tests"] = {"command": "pytest -m cuda tests", "passed": total - fail - err - skip,
                    "failed": fail, "errors": err, "skipped": skip,
                    "failures": [c.get("classname", "") + "::" + c.get("name", "")
                                 for c in suite.iter("testcase")
                                 if c.find("failure") is not None or c.find("error") is not None]}
Path(out, run_name).write_text(json.dumps(run, indent=2) + "\n")
print(json.dumps(run, indent=2))
EOF

if [ "$slug" != "none" ]; then
  mkdir -p bench/results
  for f in "$run_name" "gpu_${slug}.json" "gpu_${slug}_summary.txt" \
           "gpu_${slug}_epochs.json" "gpu_${slug}_locality.json" \
           "gpu_${slug}_locality_summary.txt"; do
    [ -f "$OUT/$f" ] && cp "$OUT/$f" bench/results/
  done
fi
rm -f "$OUT/tests.xml" "$OUT/versions.txt"  # folded into the run JSON
# At most 8 files come back from a device call: session.log (everything printed, the tests',
# the benchmarks' and the epochs' output included), build.log and the results: 6 in mode all.
ls -la "$OUT"
[ "$build_rc" -eq 0 ]
