#!/bin/sh
# One Open MPI rank on the emulated HCA: its own emulated node, LID 1 + OMPI_COMM_WORLD_RANK (so rank r
# owns 127.0.0.<r+1> for the emulated rdma_cm, docs/emulator.md), run inside st-emu-ns (the private mount
# namespace with /dev/infiniband/uverbs0 and the device's sysfs tree, which UCX needs) when ST_EMU_NS is set.
#   mpirun -np 2 [sigmatrace run -o DIR --] native/tests/mpi/rank.sh python3 -m mpi4py.bench pingpong
# SIGMATRACE_EMU_LID_BASE moves the first LID (default 1).
: "${OMPI_COMM_WORLD_RANK:?run me under Open MPI mpirun}"
export SIGMATRACE_EMU_LID=$((${SIGMATRACE_EMU_LID_BASE:-1} + OMPI_COMM_WORLD_RANK))
if [ -n "${ST_EMU_NS:-}" ]; then
	exec "$ST_EMU_NS" "$@"
fi
exec "$@"
