#!/bin/sh
# One torchrun worker on the emulated HCA: its own emulated node (LID from LOCAL_RANK), its own
# NCCL_HOSTID (two ranks on one GPU must look like two hosts to NCCL), the emulator's sysfs tree
# visible in a private mount namespace (st-emu-ns) so that NCCL resolves the device's PCI path.
#   torchrun --nproc_per_node 2 --no-python native/tests/nccl/rank.sh python3 collectives.py ...
: "${LOCAL_RANK:?run me under torchrun}"
export SIGMATRACE_EMU_LID=$((16 + LOCAL_RANK))
export NCCL_HOSTID="${NCCL_HOSTID_PREFIX:-sigmatrace-host}${LOCAL_RANK}"
if [ -n "${ST_EMU_NS:-}" ]; then
	exec "$ST_EMU_NS" "$@"
fi
exec "$@"
