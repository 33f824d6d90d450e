#!/usr/bin/env bash
# What is left to run and measure on an NVIDIA GPU, as phases that each fit one call of a lent GPU machine
# (10 minutes a call, about 30 minutes of device time a session). No session that built the GPU path had a
# GPU: every GPU figure the issues ask for comes from these phases. The phases are listed (and `all` runs them)
# in the order that gives the most for the first 30 minutes of GPU time: what can fail first, then what measures.
#
#   bash bench/gpu_session.sh prepare    # HERE, before the first call: copy the data into .gpu-data/ (git-ignored)
#                                        # since ../shared beside the checkout does not travel to the GPU machine
#   bash bench/gpu_session.sh tests      # GPU: every gpu-marked test (CUDA kernels vs numba twins vs float64
#                                        #      references; GPU labels == CPU labels; tiled == dense; sparse; eigen)
#   bash bench/gpu_session.sh engine     # GPU: bench_exact + bench_gpu_engine (MNIST 10k..70k: build, iteration,
#                                        #      end-to-end vs floors, plain CuPy, CPU) -> <date>-<gpu>.json
#   bash bench/gpu_session.sh sanitize   # GPU: the kernel tests (twins, tiled) under compute-sanitizer's memcheck
#                                        #      (out-of-bounds, misaligned, leaks; CuPy's memory pool off so every
#                                        #      array is its own allocation), racecheck (shared-memory races) and
#                                        #      synccheck (divergent barriers)
#   bash bench/gpu_session.sh scale      # GPU: tiled engine (scaling vs 2 n^2 d / GEMM up to 100,000, TF32 label
#                                        #      effect), CATS scaling to 1,000,000, Off-the-grid Figure 1
#   bash bench/gpu_session.sh big        # GPU: one 1,000,000-point iteration of the tiled engine, FP32 and TF32
#                                        #      (about 40 s a pass at FP32 on an H100)
#   bash bench/gpu_session.sh quality    # GPU: CATS vs exact on all 70,000 MNIST points (10 seeds)
#   bash bench/gpu_session.sh trimming   # GPU: trimming Table 1 at n = 70,000 (4 kernels x 10 runs)
#   bash bench/gpu_session.sh catssolve  # GPU: CATS's M_c above 32 x 32, one eigh per cluster against the
#                                        #      regularised batched solve (l = 48 ... 1024) -> cats-solve.json
#   bash bench/gpu_session.sh frontier   # GPU: the large-n frontier (bench_frontier.py): every method at n = 70,000,
#                                        #      then CATS, approx, the tiled engine and MiniBatchKMeans at n = 1,000,000
#                                        #      (MNIST repeated with pixel noise) -> <date>-<gpu>-frontier.json/png
#   bash bench/gpu_session.sh graphs     # GPU: objective="ncut" (bench_graphs.py): the quality sets with the
#                                        #      spectral start on the GPU (1 seed), then graph + clustering of MNIST
#                                        #      at 70,000 (and scikit-learn on the host's cores) and at 1,000,000
#                                        #      -> <date>-<gpu>-graphs.json
#   bash bench/gpu_session.sh all SECONDS  # the phases above in that order, each only if its time limit still fits
#                                        #      in what is left of SECONDS (e.g. `all 590` in one device call;
#                                        #      `all 1800` on a workstation); says which were left out
#
# With the device tool: carry [".gpu-data"], command "bash bench/gpu_session.sh PHASE". Without $OUT the result
# files go to bench/results/; with $OUT (the device tool's folder, which brings back at most 8 files) they and the
# logs are packed into $OUT/gpu-PHASE.tar.gz: unpack it here, move the JSON/PNG files into bench/results/ and
# commit them. Every step has its own time limit so one slow step cannot eat the call.
set -uo pipefail
cd "$(dirname "$0")/.."
phase=${1:-}
root=$PWD

if [ "$phase" = prepare ]; then
    src=${KKMGPU_DATA_DIR:-../shared/data}
    [ -d "$src/mnist" ] || { echo "no data folder at $src (set KKMGPU_DATA_DIR)"; exit 1; }
    rm -rf .gpu-data && mkdir -p .gpu-data
    cp -r "$src/mnist" "$src/shapes" "$src/uci" .gpu-data/
    du -sh .gpu-data
    echo "now call the device tool with carry [\".gpu-data\"]"
    exit 0
fi

#: the phases in the order `all` runs them, each with its worst case in seconds (the sum of its steps' limits)
PHASES="tests:540 engine:560 sanitize:560 scale:450 big:420 quality:560 trimming:560 catssolve:300 frontier:580 graphs:580"

if [ "$phase" = all ]; then
    budget=${2:-}
    case "$budget" in ''|*[!0-9]*) echo "usage: bash bench/gpu_session.sh all SECONDS (a whole number)"; exit 2 ;; esac
    start=$(date +%s)
    ran="" left_out=""
    for entry in $PHASES; do
        name=${entry%%:*} need=${entry##*:}
        remaining=$((budget - ($(date +%s) - start)))
        if [ "$need" -le "$remaining" ]; then
            echo "#### phase $name (worst case ${need}s, ${remaining}s left)"
            bash "$0" "$name"
            ran="$ran $name"
        else
            left_out="$left_out $name(${need}s)"
        fi
    done
    echo "#### ran:${ran:- none}; left out for lack of time:${left_out:- none} ($(( $(date +%s) - start ))s of ${budget}s)"
    exit 0
fi

if [ -n "${OUT:-}" ]; then out=/tmp/kkmgpu-gpu-$phase; rm -rf "$out"; else out=$root/bench/results; fi
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH}
# `python` must be one that imports CuPy: on the lent GPU machines that is a virtual environment's
# (/opt/torch/.venv), not the system python3 first on PATH (found on 2026-11-24, the first GPU session)
if ! python -c "import cupy" 2>/dev/null; then
    for venv in /opt/*/.venv; do
        if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import cupy" 2>/dev/null; then
            export PATH="$venv/bin:$PATH"
            echo "python with CuPy: $venv/bin/python"
            break
        fi
    done
fi
export KKMGPU_BENCH_RESULTS_DIR=$out
# The data: .gpu-data (carried) when ../shared/data is not beside the checkout, as on the GPU machine.
if [ ! -d ../shared/data ] && [ -d .gpu-data ]; then
    mkdir -p ../shared && ln -sfn "$root/.gpu-data" ../shared/data
fi
export KKMGPU_DATA_DIR=${KKMGPU_DATA_DIR:-$(cd ../shared/data 2>/dev/null && pwd)}
export KKMGPU_MNIST_DIR=${KKMGPU_MNIST_DIR:-$KKMGPU_DATA_DIR/mnist}

step() {  # step SECONDS NAME COMMAND...: run with a time limit, log to $out/NAME.log, report the exit status
    local limit=$1 name=$2
    shift 2
    echo "== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*"
    timeout "$limit" "$@" > >(tee "$out/$name.log") 2>&1
    local rc=$?
    echo "== $name: exit $rc"
    return 0
}

case "$phase" in
tests)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
    python -c "import kkmgpu.backend.device as b; print('cuda unusable:', b.cuda_unavailable_reason())"
    step 540 gpu-tests python -m pytest -m gpu -q -rs -p no:cacheprovider tests/
    ;;
engine)
    step 560 bench-engine env KKMGPU_BENCH_DEVICES=cuda,cpu python -m pytest bench/bench_exact.py \
        bench/bench_gpu_engine.py --benchmark-only -rs -p no:cacheprovider
    ;;
sanitize)
    # CuPy's pool hands out slices of larger blocks, where an out-of-bounds access stays inside an allocation:
    # KKMGPU_TEST_CUPY_NO_POOL=1 (tests/conftest.py) makes every array its own cudaMalloc for memcheck.
    command -v compute-sanitizer >/dev/null || { echo "compute-sanitizer not found"; exit 1; }
    compute-sanitizer --version | tail -n 1
    kernels="tests/test_twins.py tests/test_tiled.py"
    # No --leak-check: arrays still referenced when pytest exits were all it reported on 2026-11-24 (6,845
    # "leaks", no invalid access). racecheck is the slow one (it did 91% of the tests in 180 s).
    for entry in memcheck:180 racecheck:300 synccheck:60; do
        tool=${entry%%:*}
        step "${entry##*:}" "sanitize-$tool" env KKMGPU_TEST_CUPY_NO_POOL=1 compute-sanitizer --tool "$tool" \
            --error-exitcode 99 --target-processes all --print-limit 20 \
            python -m pytest -m gpu -q -x -p no:cacheprovider $kernels
    done
    ;;
scale)
    step 120 tiled-scaling python bench/bench_tiled.py scaling --device cuda
    step 60 tiled-labels python bench/bench_tiled.py labels --device cuda
    step 120 cats-scaling python bench/bench_cats.py scaling --device cuda
    step 150 offgrid-fig1 python bench/bench_offgrid.py fig1 --device cuda --sizes 1000 2000 4000 8000 16000 32000
    ;;
big)  # setup (1,000,000 x 784 jittered MNIST, ~3 GB) plus a timed pass and a full cluster-sums pass
    step 240 tiled-big python bench/bench_tiled.py big --device cuda
    step 180 tiled-big-tf32 python bench/bench_tiled.py big --device cuda --tf32
    ;;
quality)
    step 560 cats-mnist70k python bench/bench_cats.py mnist --device cuda
    ;;
trimming)  # two calls' worth of work split in two steps; both merge their cases into one result file
    step 280 trimming-table1-a python bench/bench_trimming.py table1 --device cuda --kernels neural polynomial
    step 280 trimming-table1-b python bench/bench_trimming.py table1 --device cuda --kernels rbf rbf-scale
    ;;
frontier)
    step 280 frontier-70k python bench/bench_frontier.py run --device cuda --n 70000 --seeds 0 \
        --case-timeout 120
    step 290 frontier-1m python bench/bench_frontier.py run --device cuda --n 1000000 --seeds 0 \
        --methods cats approx tiled minibatch --approx-m 1000 2000 4000 --tiled-iters 1 --case-timeout 150
    ;;
graphs)
    step 150 graphs-quality python bench/bench_graphs.py quality --device cuda --seeds 0 \
        --contestants ncut ncut_kmeanspp ratio_association
    step 130 graphs-70k python bench/bench_graphs.py speed --device cuda --n 70000 --timeout 120
    step 290 graphs-1m python bench/bench_graphs.py speed --device cuda --n 1000000 --contestants kkmgpu \
        --timeout 280
    ;;
catssolve)
    step 280 cats-solve env KKMGPU_BENCH_DEVICES=cuda python -m pytest bench/bench_cats.py -k coefficient_solve \
        --benchmark-only -p no:cacheprovider --benchmark-json="$out/cats-solve.json"
    ;;
*)
    awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"
    exit 2
    ;;
esac
ls -la "$out"
if [ -n "${OUT:-}" ]; then
    tar czf "$OUT/gpu-$phase.tar.gz" -C "$out" . && echo "packed into $OUT/gpu-$phase.tar.gz"
fi
