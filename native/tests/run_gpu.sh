#!/usr/bin/env bash
# One command for the GPU doorbell-hijack checks on a CUDA machine (no RDMA NIC
# needed: the emulated mlx5 HCA executes the WQEs).  See docs/gpu.md.
#   bash native/tests/run_gpu.sh            # build + pytest -m gpu + benchmark
#   BENCH=0 bash native/tests/run_gpu.sh    # skip the latency benchmark
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export PATH="/usr/local/cuda/bin:$PATH"
cmake -S native -B build/dev -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/dev -j"$(nproc)"
nvidia-smi -L || true
PYTHONPATH="$ROOT" python3 -m pytest -m gpu tests/test_gpu_hijack.py -q -rs -p no:cacheprovider -s
if [ "${BENCH:-1}" != "0" ]; then
  PYTHONPATH="$ROOT" python3 benchmarks/bench_hijack.py --gpu --iters "${ITERS:-5000}" --out "${OUT:-build/dev}/bench_hijack_gpu.json"
fi
