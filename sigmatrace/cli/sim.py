"""`sigmatrace sim WORKLOAD -o capture.bin`: run a workload of the SimPy model."""
import json
import sys


def register(subparsers):
    p = subparsers.add_parser(
        "sim", help="run a SimPy model workload and write a capture + ground truth",
        description="Run a workload of the SimPy testbed (sim/sigmatrace_sim). Writes the capture exactly as "
                    "the native tracer would (one process per GPU/rank, concatenated) and the ground truth "
                    "beside it (<out>.truth.npz, <out>.truth.json). See docs/model.md.")
    p.add_argument("workload", help="put | get | atomic | pingpong | bfs | moe | allreduce | stress")
    p.add_argument("-o", "--output", required=True, help="capture file to write (e.g. capture.bin)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--nodes", type=int, default=None)
    p.add_argument("--gpus-per-node", type=int, default=None)
    p.add_argument("--nics-per-node", type=int, default=None)
    p.add_argument("--mode", choices=("aggregate", "simple", "full"), default=None, help="tracer mode")
    p.add_argument("--hijack", choices=("baseline", "forward", "recovery", "nonblocking"), default=None,
                   help="doorbell path: no tracer / forward only / forward + WQE recovery / non-blocking recovery")
    p.add_argument("--batch-threshold", type=int, default=None)
    p.add_argument("--queue-depth", type=int, default=None, help="SQ depth in WQEBBs (NVSHMEM_QP_DEPTH)")
    p.add_argument("--poller-wakeup-ns", type=float, default=None)
    p.add_argument("--engine", choices=("auto", "simpy", "vector"), default=None,
                   help="allreduce: CPU proxies as SimPy processes (simpy) or closed-form generation (vector); "
                        "auto = simpy up to 8 nodes")
    p.add_argument("--param", "-p", action="append", default=[], metavar="KEY=VALUE",
                   help="workload parameter, e.g. -p skew=1.5 -p scale=10 -p size=134217728 -p iters=5")
    p.add_argument("--json", action="store_true", help="print the ground-truth summary as JSON")
    p.set_defaults(func=run)


def _value(v):
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(v.lower(), v)


def run(args):
    from sigmatrace_sim import run_workload
    params = dict(seed=args.seed, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                  nics_per_node=args.nics_per_node, mode=args.mode, hijack=args.hijack,
                  batch_threshold=args.batch_threshold, qp_depth=args.queue_depth,
                  poller_wakeup_ns=args.poller_wakeup_ns, engine=args.engine)
    for kv in args.param:
        if "=" not in kv:
            print(f"sigmatrace sim: --param expects KEY=VALUE, got {kv!r}", file=sys.stderr)
            return 2
        k, v = kv.split("=", 1)
        params[k.replace("-", "_")] = _value(v)
    try:
        res = run_workload(args.workload, args.output, **params)
    except KeyError as e:
        print(f"sigmatrace sim: {e.args[0]}", file=sys.stderr)
        return 2
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
