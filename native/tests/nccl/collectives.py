"""NCCL collectives through torch.distributed, one rank per process (torchrun), with their ground truth.

Each rank runs every collective at every size, checks the result, and prints one line per (collective,
size): `NCCL_GT {"op": ..., "bytes": S, "iters": n, "warmup": w, "rank": r, "world": W, "us": [...]}` —
S is the collective's buffer size as torch.distributed names it (all_reduce/broadcast/send: the tensor;
all_gather: the gathered output; reduce_scatter: the input; all_to_all: the input), so the bytes NCCL's
ring puts on the wire per rank follow from S and W (tests/test_gpu_nccl.py).  Two ranks on one GPU look
like two hosts to NCCL through distinct NCCL_HOSTID values (native/tests/nccl/rank.sh sets them).

    python collectives.py [--sizes 1048576,16777216] [--iters 5] [--warmup 2] [--ops all_reduce,...]
                          [--die RANK:OP:ITERATION]

--die: that rank starts that iteration's collective and kills itself (SIGKILL) while it runs, so that the
other rank is left inside the collective (tests/test_gpu_nccl.py, a rank killed mid-collective).
"""
import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default=f"{1 << 20},{16 << 20}")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--device", type=int, default=int(os.environ.get("SIGMATRACE_NCCL_DEVICE", "0")))
    ap.add_argument("--die", default="", help="RANK:OP:ITERATION -- that rank dies inside that collective")
    ap.add_argument("--gt-dir", help="also write the ground truth to GT_DIR/gt-rank<R>.jsonl (the ranks share "
                                     "one stdout, where their lines can interleave)")
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", a.device)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    ok = True
    gt = open(os.path.join(a.gt_dir, f"gt-rank{rank}.jsonl"), "w") if a.gt_dir else None
    for op in a.ops.split(","):
        for size in (int(s) for s in a.sizes.split(",")):
            n = size // 4                     # float32 elements
            times = []
            for it in range(a.warmup + a.iters):
                if a.die == f"{rank}:{op}:{it}":
                    die_inside(op, n, dev)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                good = run(op, n, rank, world, dev)
                torch.cuda.synchronize()
                if it >= a.warmup:
                    times.append((time.perf_counter() - t0) * 1e6)
                ok &= good
                if not good:
                    print(f"NCCL_BAD {op} {size} rank {rank} iteration {it}", flush=True)
            row = json.dumps(dict(op=op, bytes=size, iters=a.iters, warmup=a.warmup, rank=rank, world=world,
                                  us=[round(t, 1) for t in times]))
            print("NCCL_GT " + row, flush=True)
            if gt:
                gt.write(row + "\n")
                gt.flush()
    dist.barrier()
    dist.destroy_process_group()
    print(f"NCCL_DONE rank {rank} {'OK' if ok else 'BAD'}", flush=True)
    if gt:
        gt.write(json.dumps(dict(done=True, rank=rank, ok=ok)) + "\n")
        gt.close()
    return 0 if ok else 1


def die_inside(op, n, dev):
    """Start one all_reduce of n float32 elements, let NCCL's proxy begin moving it, and die (SIGKILL)."""
    if op != "all_reduce":
        raise SystemExit(f"--die supports all_reduce, not {op}")
    x = torch.ones(n, device=dev)
    dist.all_reduce(x, async_op=True)
    time.sleep(0.05)
    print(f"NCCL_DYING rank {os.environ['RANK']}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def run(op, n, rank, world, dev):
    """One collective of n float32 elements (the size S); True when the result is right."""
    if op == "all_reduce":
        x = torch.full((n,), float(rank + 1), device=dev)
        dist.all_reduce(x)
        return bool((x == world * (world + 1) / 2).all())
    if op == "all_gather":
        x = torch.full((n // world,), float(rank), device=dev)
        out = torch.empty(n // world * world, device=dev)
        dist.all_gather_into_tensor(out, x)
        want = torch.arange(world, device=dev, dtype=torch.float32).repeat_interleave(n // world)
        return bool((out == want).all())
    if op == "reduce_scatter":
        x = torch.full((n // world * world,), float(rank + 1), device=dev)
        out = torch.empty(n // world, device=dev)
        dist.reduce_scatter_tensor(out, x)
        return bool((out == world * (world + 1) / 2).all())
    if op == "all_to_all":
        m = n // world
        x = torch.cat([torch.full((m,), float(rank * world + j), device=dev) for j in range(world)])
        out = torch.empty(m * world, device=dev)
        dist.all_to_all_single(out, x)
        want = torch.cat([torch.full((m,), float(j * world + rank), device=dev) for j in range(world)])
        return bool((out == want).all())
    if op == "broadcast":
        x = torch.full((n,), 7.0 if rank == 0 else 0.0, device=dev)
        dist.broadcast(x, src=0)
        return bool((x == 7.0).all())
    if op == "send_recv":                 # rank 0 sends S to rank 1
        if rank == 0:
            dist.send(torch.full((n,), 3.0, device=dev), dst=1)
            return True
        if rank == 1:
            x = torch.empty(n, device=dev)
            dist.recv(x, src=0)
            return bool((x == 3.0).all())
        return True
    raise SystemExit(f"unknown collective {op}")


if __name__ == "__main__":
    sys.exit(main())
