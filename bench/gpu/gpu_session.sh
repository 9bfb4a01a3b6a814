#!/usr/bin/env bash
# Build, test and benchmark on a GPU machine in ONE device call, inside a time budget, from the
# repository root. A session is lent at most 15 minutes of device time in all (the machine's
# start, a minute or more, included) and one command runs at most 10 minutes, so everything
# the GPU has to tell us is planned as one call of `timeout_s=600`:
#
#   bash bench/gpu/stage_gpu_data.sh                               (here, before the call)
#   run(command="bash bench/gpu/gpu_session.sh", carry=[".bench_data"], timeout_s=600)
#
# Phases, in this order (a comma list as the first argument picks some, in the order given;
# "all", the default, is every one):
#   build     `pip install --no-build-isolation --no-deps .` (about 40 s; skipped when a build
#             with CUDA kernels is installed and the phases do not include "all")
#   tests     `pytest -m cuda tests`: the GPU tests (356 on 2026-11-27; the first GPU run took
#             77 s for 149), correctness before any timing
#   peers     bench/peers/peers.py: this layer (each GPU backend), the authors' implicit layer (from
#             the checkout staged in .bench_data/authors_dignn, or $DIGNN_AUTHORS), torchdeq's
#             DEQ (its wheel staged in .bench_data/wheels) and the plain PyG composition, on the
#             same graphs and weights in one process: agreement with the float64 oracle, step
#             time, peak memory; a peer that is not there is recorded as absent. Before bench,
#             whose summary takes the ratios to the peers from this phase's JSON
#   bench     bench/layer/test_gpu_speed.py: the layer step on cornell5 and the Penn94-shaped graphs
#             against the plain composition and the paper's algorithm, the cached sweep against
#             its gather floor, the cg sweep, 16-bit storage on the products-sized graph, the
#             captured step, per-kernel times cuda against triton; its summary states each goal
#   locality  bench/layer/test_locality.py -m cuda: `reorder=` on the products-sized block model with
#             shuffled ids and on cornell5 (goal: the products-sized step <= 150 ms)
#   epochs    bench/gpu/gpu_epochs.py: ms per `dignn train` epoch per dataset and backend
#   kernels   the sm_90 compile of every Triton kernel variant with this machine's Triton: no
#             register spills (tests/test_triton.py::test_kernels_compile_for_the_gpu, which the
#             CPU CI also runs with its own Triton)
#
# Budget: SESSION_BUDGET seconds (default 560) from this script's start. Each phase gets the
# smaller of its own cap and what is left of the budget (less RESERVE, default 20 s, for the
# records), and is skipped, and recorded as skipped, when less than its floor is left. A phase
# that runs out of time gets SIGINT, so pytest still writes its benchmark JSON and the bench
# conftest writes the summary of what was measured (marked INTERRUPTED); SIGKILL 20 s later.
# The run record is rewritten after every phase, so whatever happens to the call, $OUT holds
# the state of every phase that ended. Caps and floors (seconds), each cap overridable:
#   build 200/60 (BUILD_TIMEOUT), tests 220/60 (TESTS_TIMEOUT; one test at most
#   TEST_TIMEOUT=120 s, in TEST_WORKERS=4 processes: see the tests phase below), peers 150/60
#   (PEERS_TIMEOUT; the harness stops starting measurements 20 s before its limit), bench
#   200/60 (BENCH_TIMEOUT), locality 240/90 (LOCALITY_TIMEOUT), epochs 100/40
#   (EPOCHS_TIMEOUT), kernels 90/40 (KERNELS_TIMEOUT).
# Estimates for an H100 (none of them measured yet as phases of this script): build 40 s,
# tests 100-200 s, peers 60-150 s (the authors' layer's step was 273-384 ms on the first
# run's H100; the harness stops at its budget), bench 100-170 s, locality 100-170 s (the block
# model of 124M CSR entries is drawn on the CPU: 37 s on one core of a 2-core CPU machine; its
# RCM order, scipy on the CPU, 17 s there, computed twice, for "rcm" and for "auto"), epochs
# about 100 s. So one call usually ends within the budget after bench or locality; what did
# not fit is listed in the run record
# as "skipped: out of time", and a second call right after the first, while the machine is
# still warm (it is given back 30 s after a call), runs the rest without a build:
#   run(command="bash bench/gpu/gpu_session.sh locality,epochs,kernels", carry=[".bench_data"],
#       timeout_s=400)
#
# Everything lands in $OUT (the files that come back: at most 8), named as they go under
# bench/results/:
#   gpu_<device>_run.json      device, versions, budget, every phase's rc, seconds and status,
#                              test pass/fail/skip counts (gpu_<device>_<phases>_run.json for
#                              phases other than all)
#   gpu_<device>_peers.json    the peers harness's record (bench/peers/peers.py's format)
#   gpu_<device>.json          the pytest-benchmark JSON of bench
#   gpu_<device>_summary.txt   bench's table and every goal met or missed
#   gpu_<device>_epochs.json   ms per `dignn train` epoch per dataset and backend
#   gpu_<device>_locality.json the locality benchmark's pytest-benchmark JSON
#   gpu_<device>_locality_summary.txt  its goal (products-sized step <= 150 ms), met or missed
#   session.log                everything printed: versions, tests, benchmarks, epochs
#   build.log                  only when the build failed
# and copies of the results under bench/results/ of the tree it ran in.
#
# Data: the real graphs (cornell5, Cora, chameleon, amherst41) are read from $DIGNN_DATA, else
# ./shared/data, else ./.bench_data: `bash bench/gpu/stage_gpu_data.sh` fills that folder from
# ../shared/data and lists it in .git/info/exclude; a device call takes it along when its carry
# names ".bench_data". Graphs whose files are missing are skipped and the summaries say so.
set -x -o pipefail

ALL_PHASES="tests,peers,bench,locality,epochs,kernels"
ASKED="${1:-all}"
PHASES="$ASKED"
[ "$ASKED" = "all" ] && PHASES="$ALL_PHASES"
for phase in ${PHASES//,/ }; do
  case ",$ALL_PHASES," in
    *",$phase,"*) ;;
    *) echo "unknown phase '$phase': give 'all' or a comma list of $ALL_PHASES" >&2; exit 2 ;;
  esac
done

BUDGET="${SESSION_BUDGET:-560}"
RESERVE="${RESERVE:-20}"
OUT="${OUT:-$(mktemp -d)}"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
# Import the installed package, not the source tree in the working directory.
export PYTHONSAFEPATH=1
mkdir -p "$OUT"
SCRATCH="$(mktemp -d)"  # records that are folded into the run JSON; not sent back
exec > >(tee -a "$OUT/session.log") 2>&1

cd "$(dirname "$0")/../.." || exit 1

if [ -z "${DIGNN_DATA:-}" ]; then
  for cand in shared/data .bench_data ../shared/data; do
    if [ -f "$cand/cornell5/raw/data.mat" ]; then
      DIGNN_DATA="$(cd "$cand" && pwd)"
      break
    fi
  done
fi
export DIGNN_DATA="${DIGNN_DATA:-$PWD/.bench_data}"

nvidia-smi || true
nvcc --version || true
# versions.txt for the record, versions.json for the fields it takes (one torch import)
$PY - "$SCRATCH/versions.json" <<'EOF' | tee "$SCRATCH/versions.txt"
import json, platform, sys, torch
device = torch.cuda.get_device_name() if torch.cuda.is_available() else None
with open(sys.argv[1], "w") as f:
    json.dump({"device": device, "torch": torch.__version__, "cuda": torch.version.cuda}, f)
print("python", platform.python_version())
print("torch", torch.__version__, "cuda", torch.version.cuda)
print("device", device)
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

device_name="$($PY -c 'import json, sys; print(json.load(open(sys.argv[1]))["device"] or "")' \
  "$SCRATCH/versions.json" 2>/dev/null)"
slug="$(echo "${device_name:-none}" | tr 'A-Z' 'a-z' | sed -E 's/nvidia //; s/[^a-z0-9]+/_/g; s/^_+|_+$//g')"
slug="${slug:-none}"
run_name="gpu_${slug}_run.json"
[ "$ASKED" = "all" ] || run_name="gpu_${slug}_${PHASES//,/-}_run.json"

: > "$SCRATCH/phases.tsv"  # name, rc (or null), seconds, timeout given, status

write_run() {  # the run record, from what $SCRATCH holds now
  $PY - "$OUT" "$run_name" "$SCRATCH" "$BUDGET" "$SECONDS" "$ASKED" "$PHASES" <<'EOF'
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path
out, run_name, scratch, budget, elapsed, asked, phases = sys.argv[1:]
fields = Path(scratch, "versions.json")
run = json.loads(fields.read_text()) if fields.exists() else {"device": None, "torch": None,
                                                              "cuda": None}
run.update(asked=asked, phases_asked=phases.split(","), budget_s=int(budget),
           elapsed_s=int(elapsed), versions=Path(scratch, "versions.txt").read_text().splitlines(),
           phases=[])
for line in Path(scratch, "phases.tsv").read_text().splitlines():
    name, rc, seconds, given, status = line.split("\t")
    run["phases"].append({"name": name, "rc": json.loads(rc), "seconds": int(seconds),
                          "timeout_s": int(given), "status": status})
    run[f"{name}_rc"] = json.loads(rc)  # the earlier records' fields
build = [p for p in run["phases"] if p["name"] == "build"]
run["build_seconds"] = build[0]["seconds"] if build and build[0]["rc"] is not None else None
xml = Path(scratch, "tests.xml")
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
print(json.dumps({k: v for k, v in run.items() if k != "versions"}, indent=2))
EOF
}

record() {  # record NAME RC SECONDS GIVEN STATUS
  printf '%s\t%s\t%s\t%s\t%s\n' "$@" >> "$SCRATCH/phases.tsv"
  write_run
}

# run_phase NAME CAP FLOOR COMMAND...: COMMAND under `timeout -s INT` for the smaller of CAP and
# the budget left, or a record that it was skipped; returns COMMAND's rc (1 when skipped).
run_phase() {
  local name="$1" cap="$2" floor="$3"
  shift 3
  local left=$(( BUDGET - SECONDS - RESERVE ))
  if [ "$left" -lt "$floor" ]; then
    echo "=== $name: skipped, ${left} s of the budget left (it needs ${floor} s)"
    record "$name" null 0 0 "skipped: out of time (${left} s left, needs ${floor} s)"
    return 1
  fi
  local given=$(( cap < left ? cap : left ))
  echo "=== $name: up to ${given} s ($(( BUDGET - SECONDS )) s of the budget left)"
  local start=$SECONDS rc
  if [ -n "${PHASE_LOG:-}" ]; then
    timeout -s INT -k 20 "$given" "$@" > "$PHASE_LOG" 2>&1
  else
    timeout -s INT -k 20 "$given" "$@"
  fi
  rc=$?
  local status="ran"
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && status="stopped at its ${given} s limit"
  record "$name" "$rc" $(( SECONDS - start )) "$given" "$status"
  return "$rc"
}

phase_asked() { case ",$PHASES," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

have_build() {
  $PY -c 'import dignn_kernels, sys; sys.exit(0 if dignn_kernels._build_info.WITH_CUDA else 1)' \
    2>/dev/null
}

build_ok=1
if [ "$ASKED" = "all" ] || ! have_build; then
  PHASE_LOG="$SCRATCH/build.log" run_phase build "${BUILD_TIMEOUT:-200}" 60 \
    $PY -m pip install --no-build-isolation --no-deps -v .
  build_rc=$?
  if [ "$build_rc" -ne 0 ]; then
    build_ok=0
    echo "NO BUILD (rc=$build_rc)"
  fi
  if [ -s "$SCRATCH/build.log" ]; then
    tail -n 30 "$SCRATCH/build.log"
    [ "$build_ok" -eq 1 ] || cp "$SCRATCH/build.log" "$OUT/build.log"
  fi
fi
$PY -c 'import dignn_kernels as dk; print("installed:", dk.__file__, dk._build_info.CUDA_ARCHS, dk.available_backends(__import__("torch").device("cuda")))'

# The GPU tests: one test at most TEST_TIMEOUT s where pytest-timeout is installed, and spread
# over TEST_WORKERS processes where pytest-xdist is (both are on the GPU image): a test that
# crashes its process (the first GPU run's segfault ended the whole run) then fails alone, its
# worker is replaced and the other tests still run and are counted.
test_options=()
if $PY -c 'import pytest_timeout' 2>/dev/null; then
  test_options+=("--timeout=${TEST_TIMEOUT:-120}")
fi
if [ "${TEST_WORKERS:-4}" -gt 1 ] && $PY -c 'import xdist' 2>/dev/null; then
  test_options+=(-n "${TEST_WORKERS:-4}")
fi

for phase in ${PHASES//,/ }; do
  if [ "$build_ok" -eq 0 ]; then
    record "$phase" null 0 0 "skipped: no build"
    continue
  fi
  case "$phase" in
    tests)
      run_phase tests "${TESTS_TIMEOUT:-220}" 60 \
        $PY -m pytest -m cuda tests -q -rs -p no:cacheprovider --durations=25 \
        "${test_options[@]}" --junitxml="$SCRATCH/tests.xml" ;;
    peers)
      # torchdeq from the staged wheel where the machine lacks it (it has no network)
      if ! $PY -c 'import torchdeq' 2>/dev/null; then
        for wheel in .bench_data/wheels/torchdeq-*.whl; do
          [ -f "$wheel" ] && $PY -m pip install --quiet --no-deps "$wheel"
        done
      fi
      authors="${DIGNN_AUTHORS:-}"
      if [ -z "$authors" ] && [ -f .bench_data/authors_dignn/nodeclassification/src/layers.py ]; then
        authors="$PWD/.bench_data/authors_dignn"
      fi
      peers_cap="${PEERS_TIMEOUT:-150}"
      peers_left=$(( BUDGET - SECONDS - RESERVE ))
      peers_given=$(( peers_cap < peers_left ? peers_cap : peers_left ))
      PYTHONPATH="$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" \
        run_phase peers "$peers_cap" 60 \
        $PY bench/peers/peers.py --device cuda ${authors:+--authors "$authors"} \
        --graphs cornell5,penn94_like,chameleon-directed,cora \
        --budget-s $(( peers_given > 40 ? peers_given - 20 : 20 )) \
        --out "$OUT/gpu_${slug}_peers.json" ;;
    bench)
      DIGNN_PEERS_JSON="$OUT/gpu_${slug}_peers.json" \
      DIGNN_BENCH_SUMMARY="$OUT/gpu_${slug}_summary.txt" \
        run_phase bench "${BENCH_TIMEOUT:-200}" 60 \
        $PY -m pytest bench/layer/test_gpu_speed.py -q -s -rs -p no:cacheprovider \
        --benchmark-json "$OUT/gpu_${slug}.json" ;;
    locality)
      DIGNN_LOCALITY_SUMMARY="$OUT/gpu_${slug}_locality_summary.txt" \
        run_phase locality "${LOCALITY_TIMEOUT:-240}" 90 \
        $PY -m pytest bench/layer/test_locality.py -m cuda -q -s -rs -p no:cacheprovider \
        --benchmark-json "$OUT/gpu_${slug}_locality.json" ;;
    epochs)
      run_phase epochs "${EPOCHS_TIMEOUT:-100}" 40 \
        $PY bench/gpu/gpu_epochs.py --out "$OUT" --device cuda ;;
    kernels)
      run_phase kernels "${KERNELS_TIMEOUT:-90}" 40 \
        $PY -m pytest tests/test_triton.py -q -s -p no:cacheprovider \
        -k test_kernels_compile_for_the_gpu ;;
  esac
done
write_run

if [ "$slug" != "none" ]; then
  mkdir -p bench/results
  for f in "$run_name" "gpu_${slug}.json" "gpu_${slug}_summary.txt" "gpu_${slug}_peers.json" \
           "gpu_${slug}_epochs.json" "gpu_${slug}_locality.json" \
           "gpu_${slug}_locality_summary.txt"; do
    [ -f "$OUT/$f" ] && cp "$OUT/$f" bench/results/
  done
fi
rm -rf "$SCRATCH"
# At most 8 files come back from a device call: session.log, the run record, the peers' JSON,
# bench's JSON and summary, the epochs' JSON, the locality JSON and summary (8); build.log
# takes the place of the others when the build failed (then no phase ran).
ls -la "$OUT"
[ "$build_ok" -eq 1 ]
