#!/usr/bin/env bash
# Step-by-step probe of real NVSHMEM (IBGDA) over the emulated HCA on one GPU, each step bounded in time and
# logged to $OUT (or build/nvshmem-probe), so a hang shows where it hangs:
#   OUT=/tmp/p bash native/tests/nvshmem/probe.sh [STEPS]
# STEPS: a list of untraced-cpu untraced-gpu traced-cpu traced-gpu (default: all four).
# The gpu test (tests/test_gpu_nvshmem.py) runs the same commands with the full checks.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/build/nvshmem-probe}"
WORK="${WORK:-/tmp/nvshmem-probe.$$}"     # everything; $OUT gets probe.log and one archive (few files come back)
mkdir -p "$OUT" "$WORK"
STEPS="${*:-untraced-cpu untraced-gpu traced-cpu traced-gpu}"
ITERS="${ITERS:-2000}" WARMUP="${WARMUP:-200}" STEP_TIMEOUT="${STEP_TIMEOUT:-90}"
export PATH="/usr/local/cuda/bin:$PATH"
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/probe.log"; }
pack() { tar -C "$WORK" --exclude=nvshmem_lat --exclude=lib --exclude='*.trace' -czf "$OUT/probe-logs.tgz" . 2>/dev/null; }
trap pack EXIT

BUILD=build/dev
if [ ! -f "$BUILD/libsigmatrace.so" ] || [ ! -f "$BUILD/emu/libibverbs.so.1" ]; then
  log "build"
  { cmake -S native -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build "$BUILD" -j"$(nproc)"; } \
    >"$WORK/build.log" 2>&1 || { log "build failed"; tail -30 "$WORK/build.log"; exit 1; }
fi
HOME_NVSH="${NVSHMEM_HOME:-$(python3 -c 'import nvidia.nvshmem as m; print(list(m.__path__)[0])' 2>/dev/null)}"
[ -f "$HOME_NVSH/include/nvshmem.h" ] || { log "NVSHMEM not found (NVSHMEM_HOME)"; exit 1; }
LIB="$HOME_NVSH/lib"
BIN="$WORK/nvshmem_lat"
LINKDIR="$WORK/lib"; mkdir -p "$LINKDIR"
[ -e "$LIB/libnvshmem_host.so" ] || ln -sf "$LIB/libnvshmem_host.so.3" "$LINKDIR/libnvshmem_host.so"
log "nvcc"
nvcc -O2 -std=c++17 -arch=sm_90 -rdc=true -I"$HOME_NVSH/include" native/tests/nvshmem/nvshmem_lat.cu -o "$BIN" \
  -L"$LINKDIR" -L"$LIB" -lnvshmem_host -lnvshmem_device -lcudart -Xlinker=-rpath="$LIB" >"$WORK/nvcc.log" 2>&1 \
  || { log "nvcc failed"; tail -30 "$WORK/nvcc.log"; exit 1; }
ls "$LIB" >"$WORK/nvshmem-lib.txt"
# how the transport reaches verbs and the CUDA runtime (a static cudart binds its driver calls itself)
for so in "$LIB"/nvshmem_transport_ibgda.so* "$LIB"/libnvshmem_host.so.3; do
  [ -f "$so" ] && { echo "== $so"; ldd "$so"; nm -D --defined-only "$so" 2>/dev/null | grep -c ' cuda' ;
    nm -D --undefined-only "$so" 2>/dev/null | grep -i 'cudaHostRegister\|dlopen\|dlsym'; }
done >"$WORK/nvshmem-deps.txt" 2>&1

MPS_STARTED=0
if command -v nvidia-cuda-mps-control >/dev/null && ! pgrep -x nvidia-cuda-mps >/dev/null 2>&1; then
  nvidia-cuda-mps-control -d && MPS_STARTED=1
fi
trap 'pack; [ "$MPS_STARTED" = 1 ] && echo quit | nvidia-cuda-mps-control || true' EXIT

EMU="$ROOT/$BUILD/emu"
NS=()
[ "$(id -u)" = 0 ] && [ -x "$EMU/st-emu-ns" ] && NS=("$EMU/st-emu-ns")
for step in $STEPS; do
  handler="${step#*-}"; traced="${step%%-*}"
  # NVSHMEM 3.4.5: "cpu" is the proxy handler through GDRCopy; without GDRCopy it is "cpu_host_memory"
  [ "$handler" = cpu ] && handler=cpu_host_memory
  d="$WORK/$step"; rm -rf "$d"; mkdir -p "$d/stats"
  fabric="probe$$${handler}${traced}"
  log "step $step"
  # a PE killed by the step's timeout can leave MPS refusing new clients ("busy or unavailable"): restart it
  if [ "$MPS_STARTED" = 1 ]; then echo quit | nvidia-cuda-mps-control; sleep 1; nvidia-cuda-mps-control -d; fi
  pids=()
  for pe in 0 1; do
    (
      export LD_LIBRARY_PATH="$EMU:$LIB:${LD_LIBRARY_PATH:-}"
      export SIGMATRACE_EMU_FABRIC="$fabric" SIGMATRACE_EMU_LID=$((16 + pe)) SIGMATRACE_EMU_DC=1
      export SIGMATRACE_EMU_STATS="$d/stats/emu-stats.%p.json" NVSHMEM_DISABLE_DATA_DIRECT=1
      export NVSHMEM_IB_ENABLE_IBGDA=1 NVSHMEM_DISABLE_P2P=1 NVSHMEM_IBGDA_NIC_HANDLER="$handler"
      export NVSHMEM_IBGDA_FORCE_NIC_BUF_MEMTYPE=hostmem NVSHMEM_HCA_LIST=mlx5_0 NVSHMEM_DISABLE_NVLS=1
      export NVSHMEM_DEBUG="${NVSHMEM_DEBUG:-INFO}" NVSHMEM_BOOTSTRAP=UID NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=lo NVSHMEM_DISABLE_NCCL=1
      pre=()
      [ "$handler" = gpu ] && pre+=("$EMU/libsigmatrace_emu_cudashim.so")
      if [ "$traced" = traced ]; then
        pre+=("$ROOT/$BUILD/libsigmatrace.so")
        # simple by default: full mode records every empty poll of NVSHMEM's proxy thread (F3), 5 M events/s
        export SIGMATRACE_OUTPUT_DIR="$d/trace" SIGMATRACE_MODE="${TRACE_MODE:-simple}"
      fi
      [ "${#pre[@]}" -gt 0 ] && export LD_PRELOAD="${pre[*]}"
      exec timeout -s KILL "$STEP_TIMEOUT" "${NS[@]}" "$BIN" "$pe" 2 "$d/uid.bin" "$ITERS" "$WARMUP" 8
    ) >"$d/pe$pe.log" 2>&1 &
    pids+=($!)
  done
  rcs=""
  for p in "${pids[@]}"; do wait "$p"; rcs="$rcs $?"; done
  log "step $step rc:$rcs; $(grep -h '^LAT\|^RESULT' "$d"/pe*.log | tr '\n' ';')"
  rm -rf /dev/shm/sigmatrace-emu."$fabric".* 2>/dev/null
  if [ -d "$d/trace" ]; then
    ls -la "$d/trace" >"$d/trace-files.txt"
    PYTHONPATH="$ROOT:$ROOT/sim" timeout 120 python3 native/tests/nvshmem/summarize.py "$d" >"$d/correlate.txt" 2>&1 || true
  fi
  for pe in 0 1; do grep -n -i "error\|warn\|fail\|abort" "$d/pe$pe.log" | head -15 | sed "s/^/  pe$pe: /" | tee -a "$OUT/probe.log"; done
done
exit 0
