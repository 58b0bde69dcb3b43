#!/usr/bin/env bash
# One command for real NVSHMEM (IBGDA) over the emulated HCA on one GPU, traced:
#   bash native/tests/run_nvshmem.sh            # build, pytest -m gpu tests/test_gpu_nvshmem.py, Fig. 4 benchmark
#   BENCH=0 bash native/tests/run_nvshmem.sh    # skip the benchmark (ROUNDS, ITERS, OUT: its settings)
#   STRESS=nonblocking RUNS=12 bash native/tests/run_nvshmem.sh   # hang hunt: traced runs (TRACED_ONLY= : interleaved with untraced ones), each hang's
#                                               # thread states and the emulated NIC's watchdog dump kept
# Needs: an NVIDIA GPU, nvcc, NVSHMEM 3.4.5 (NVSHMEM_HOME, or the nvidia-nvshmem wheel importable by python3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export PATH="/usr/local/cuda/bin:$PATH"
cmake -S native -B build/dev -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/dev -j"$(nproc)" >/dev/null
MPS_STARTED=0
if command -v nvidia-cuda-mps-control >/dev/null && ! pgrep -x nvidia-cuda-mps >/dev/null 2>&1; then
  nvidia-cuda-mps-control -d && MPS_STARTED=1
fi
trap '[ "$MPS_STARTED" = 1 ] && echo quit | nvidia-cuda-mps-control || true' EXIT
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
rc=0
if [ -n "${STRESS:-}" ]; then   # the hang hunt: STRESS=<hijack mode> RUNS=n [HANDLER=...] (traced runs only)
  PYTHONPATH="$ROOT:$ROOT/sim" python3 benchmarks/bench_nvshmem.py --stress "$STRESS" --runs "${RUNS:-10}" \
    --handler "${HANDLER:-cpu_host_memory}" ${TRACED_ONLY---traced-only} --keep "${OUT:-build/dev}/stress" \
    --out "${OUT:-build/dev}/stress.json" || rc=$?
  exit "$rc"
fi
PYTHONPATH="$ROOT:$ROOT/sim" python3 -m pytest -m gpu tests/test_gpu_nvshmem.py -q -rs -p no:cacheprovider -s || rc=$?
if [ "${BENCH:-1}" != "0" ]; then
  PYTHONPATH="$ROOT:$ROOT/sim" python3 benchmarks/bench_nvshmem.py --rounds "${ROUNDS:-5}" --iters "${ITERS:-5000}" \
    --out "${OUT:-build/dev}/bench_nvshmem.json" || rc=$?
fi
exit "$rc"
