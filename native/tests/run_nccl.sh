#!/usr/bin/env bash
# One command for real NCCL over the emulated HCA on one GPU, traced (docs/nccl.md):
#   bash native/tests/run_nccl.sh              # build, pytest -m gpu tests/test_gpu_nccl.py, benchmark
#   BENCH=0 bash native/tests/run_nccl.sh      # skip the benchmark
# Needs: an NVIDIA GPU, torch with NCCL (e.g. the torch venv's python3 first on PATH), CMake, a C compiler.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
cmake -S native -B build/dev -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/dev -j"$(nproc)" >/dev/null
nvidia-smi -L || true
# both ranks' kernels on the one GPU at once (NCCL's kernels of two ranks wait on each other)
MPS_STARTED=0
if command -v nvidia-cuda-mps-control >/dev/null && ! pgrep -x nvidia-cuda-mps >/dev/null 2>&1; then
  nvidia-cuda-mps-control -d && MPS_STARTED=1
fi
trap '[ "$MPS_STARTED" = 1 ] && echo quit | nvidia-cuda-mps-control || true' EXIT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
rc=0
PYTHONPATH="$ROOT:$ROOT/sim${PYTHONPATH:+:$PYTHONPATH}" python3 -m pytest -m gpu tests/test_gpu_nccl.py -q -rs -p no:cacheprovider -s ${PYTEST_ARGS:-} || rc=$?
if [ "${BENCH:-1}" != "0" ]; then
  PYTHONPATH="$ROOT:$ROOT/sim${PYTHONPATH:+:$PYTHONPATH}" python3 benchmarks/bench_nccl.py --rounds "${ROUNDS:-5}" --iters "${ITERS:-20}" \
    --out "${OUT:-build/dev}/bench_nccl.json" || rc=$?
fi
exit "$rc"
