"""`sigmatrace sim WORKLOAD -o capture.bin`: run a workload of the SimPy model."""
import json
import os
import sys
from pathlib import Path

from ..errors import SigmatraceError
from .args import nonneg_float, positive_int, queue_depth


def register(subparsers):
    p = subparsers.add_parser(
        "sim", help="run a SimPy model workload and write a capture + ground truth",
        description="Run a workload of the SimPy testbed (sim/sigmatrace_sim). Writes the capture exactly as "
                    "the native tracer would (one process per GPU/rank, concatenated) and the ground truth "
                    "beside it (<out>.truth.npz, <out>.truth.json). See docs/model.md.")
    p.add_argument("workload", help="put | get | atomic | pingpong | bfs | moe | allreduce | stress")
    p.add_argument("-o", "--output", required=True, help="capture file to write (e.g. capture.bin)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: the workload's own)")
    p.add_argument("--nodes", type=positive_int, default=None, help="nodes (default: the workload's own)")
    p.add_argument("--gpus-per-node", type=positive_int, default=None, help="GPUs per node (default: the workload's own)")
    p.add_argument("--nics-per-node", type=positive_int, default=None, help="NICs per node (default: the workload's own)")
    p.add_argument("--mode", choices=("aggregate", "simple", "full"), default=None, help="tracer mode")
    p.add_argument("--hijack", choices=("baseline", "forward", "recovery", "nonblocking"), default=None,
                   help="doorbell path: no tracer / forward only / forward + WQE recovery / non-blocking recovery")
    p.add_argument("--batch-threshold", type=positive_int, default=None, help="WQEBBs per recovery batch")
    p.add_argument("--queue-depth", type=queue_depth, default=None,
                   help="SQ depth in WQEBBs, a power of two (NVSHMEM_QP_DEPTH)")
    p.add_argument("--poller-wakeup-ns", type=nonneg_float, default=None, help="poller wake-up latency in ns")
    p.add_argument("--engine", choices=("auto", "simpy", "vector"), default=None,
                   help="allreduce: CPU proxies as SimPy processes (simpy) or closed-form generation (vector); "
                        "auto = simpy up to 8 nodes")
    p.add_argument("--param", "-p", action="append", default=[], metavar="KEY=VALUE",
                   help="workload parameter, e.g. -p skew=1.5 -p scale=10 -p size=134217728 -p iters=5")
    p.add_argument("--json", action="store_true", help="print the ground-truth summary as JSON")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bars (shown on a terminal only: simulate and write, with their totals)")
    p.set_defaults(func=run)


def _value(v):
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(v.lower(), v)


def _check_output(path):
    """The capture file and its ground truth can be written (checked before a long run, not after it)."""
    out = Path(path)
    if out.is_dir():
        raise SigmatraceError(f"{out} is a directory; give a capture file name (e.g. {out / 'capture.bin'})")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise SigmatraceError(f"{parent}: no such directory")
    if not os.access(parent, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise SigmatraceError(f"{out}: not writable")


def run(args):
    from sigmatrace_sim import run_workload
    from sigmatrace_sim.workloads import WORKLOADS, WorkloadError
    if args.workload not in WORKLOADS:
        raise SigmatraceError(f"unknown workload {args.workload!r}; known: {', '.join(sorted(WORKLOADS))}")
    params = dict(seed=args.seed, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                  nics_per_node=args.nics_per_node, mode=args.mode, hijack=args.hijack,
                  batch_threshold=args.batch_threshold, qp_depth=args.queue_depth,
                  poller_wakeup_ns=args.poller_wakeup_ns, engine=args.engine)
    for kv in args.param:
        if "=" not in kv:
            raise SigmatraceError(f"--param expects KEY=VALUE, got {kv!r}")
        k, v = kv.split("=", 1)
        params[k.replace("-", "_")] = _value(v)
    _check_output(args.output)
    from ..progress import Progress
    try:
        with Progress(args.quiet) as progress:
            res = run_workload(args.workload, args.output, progress=progress, **params)
    except WorkloadError as e:
        raise SigmatraceError(str(e)) from None
    except OSError as e:
        raise SigmatraceError(f"{e.filename or args.output}: {e.strerror or e}") from None
    except (ValueError, ArithmeticError) as e:
        # a combination the model cannot build (each parameter alone was in range)
        raise SigmatraceError(f"{args.workload}: parameters the model cannot run: {e}") from None
    counts = res.meta.get("counts", {})
    if args.json:
        json.dump({k: v for k, v in res.meta.items() if k not in ("processes", "timing")}, sys.stdout, indent=1,
                  default=str)
        print()
    else:
        print(f"{args.workload}: wrote {res.output} ({res.bytes} bytes, {res.events} events); "
              f"ground truth {res.truth_npz}, {res.truth_json}")
        if counts:
            print("  " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    return 0
