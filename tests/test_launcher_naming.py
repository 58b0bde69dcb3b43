"""`sigmatrace run` under srun and torchrun: file names and process headers from the launchers' variables.

Neither launcher is installed here, so each test sets the environment the launcher gives its tasks
(Slurm 23's srun: SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/SLURM_NODEID/SLURM_JOB_ID/SLURM_STEP_ID...;
torch.distributed.run: RANK/LOCAL_RANK/WORLD_SIZE/LOCAL_WORLD_SIZE/GROUP_RANK/ROLE_RANK/
TORCHELASTIC_RUN_ID/MASTER_ADDR/MASTER_PORT...) and runs `sigmatrace run --eager` around a program
that calls no traced library (--eager writes the file and its header at start).  The tracer reads
these variables once at load (native/src/core/process.c st_writer_init) and names the file
<host>.<pid>.r<rank>.<uid>.trace (native/src/core/lifecycle.c open_output).
"""
import os
import re
import subprocess
import sys

import pytest

from sigmatrace import _native
from sigmatrace.format import read_capture

pytestmark = [pytest.mark.sim,
              pytest.mark.skipif(_native.tracer_library() is None, reason="libsigmatrace.so not built")]

LAUNCHER_VARS = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK",
                 "PMI_SIZE", "PMIX_RANK", "PMI_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_PROCID", "SLURM_NTASKS",
                 "SLURM_LOCALID", "RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")


def srun_env(procid, ntasks, localid, nodeid=0, job=4242):
    """What srun -N2 -n<ntasks> gives task <procid> (Slurm's task environment, srun(1) OUTPUT ENVIRONMENT)."""
    return dict(SLURM_PROCID=procid, SLURM_NTASKS=ntasks, SLURM_NPROCS=ntasks, SLURM_LOCALID=localid,
                SLURM_NODEID=nodeid, SLURM_JOB_ID=job, SLURM_JOBID=job, SLURM_STEP_ID=0, SLURM_STEPID=0,
                SLURM_NNODES=2, SLURM_JOB_NUM_NODES=2, SLURM_TASKS_PER_NODE=f"{ntasks // 2}(x2)",
                SLURM_STEP_NUM_TASKS=ntasks, SLURM_CPUS_ON_NODE=2, SLURM_NODELIST="n[1-2]",
                SLURM_TOPOLOGY_ADDR="n1", SLURM_CLUSTER_NAME="c", SLURMD_NODENAME=f"n{nodeid + 1}")


def torchrun_env(rank, world, local_rank, group_rank, nproc_per_node):
    """What torchrun --nnodes N --nproc_per_node P gives a worker (torch.distributed.elastic agent)."""
    return dict(RANK=rank, LOCAL_RANK=local_rank, WORLD_SIZE=world, LOCAL_WORLD_SIZE=nproc_per_node,
                GROUP_RANK=group_rank, GROUP_WORLD_SIZE=world // nproc_per_node, ROLE_RANK=rank,
                ROLE_NAME="default", ROLE_WORLD_SIZE=world, MASTER_ADDR="127.0.0.1", MASTER_PORT=29500,
                TORCHELASTIC_RUN_ID="sigmatrace-test", TORCHELASTIC_RESTART_COUNT=0, TORCHELASTIC_MAX_RESTARTS=0,
                TORCHELASTIC_USE_AGENT_STORE="True", TORCH_NCCL_ASYNC_ERROR_HANDLING=1, OMP_NUM_THREADS=1)


def traced(out, launcher_env):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and k != "LD_PRELOAD"}
    env.update({k: str(v) for k, v in launcher_env.items()})
    env["PYTHONPATH"] = str(_native.SOURCE_ROOT)
    r = subprocess.run([sys.executable, "-m", "sigmatrace", "run", "--eager", "-o", str(out), "--",
                        "/bin/sh", "-c", "echo $$"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip())


def check(out, want):
    """want: {pid: (rank, world_size, local_rank, launcher)}"""
    files = sorted(p.name for p in out.iterdir())
    assert len(files) == len(want), files
    host = None
    for name in files:
        m = re.fullmatch(r"(.+)\.(\d+)\.r(-|\d+)\.([0-9a-f]{16})\.trace", name)
        assert m, name
        host = host or m.group(1)
        assert m.group(1) == host
        pid = int(m.group(2))
        assert pid in want, (name, want)
        assert m.group(3) == str(want[pid][0]), name
    cap = read_capture(out)
    got = {p.header["pid"]: (p.header["rank"], p.header["world_size"], p.header["local_rank"], p.header["launcher"])
           for p in cap.processes}
    assert got == want
    return cap


def test_srun_two_nodes_four_tasks(tmp_path):
    out = tmp_path / "t"
    want = {}
    for procid in range(4):
        pid = traced(out, srun_env(procid, 4, procid % 2, nodeid=procid // 2))
        want[pid] = (procid, 4, procid % 2, "srun")
    cap = check(out, want)
    assert sorted(p.rank for p in cap.processes) == [0, 1, 2, 3]


def test_torchrun_two_nodes_two_workers_each(tmp_path):
    out = tmp_path / "t"
    want = {}
    for group in range(2):
        for local in range(2):
            rank = group * 2 + local
            pid = traced(out, torchrun_env(rank, 4, local, group, 2))
            want[pid] = (rank, 4, local, "torchrun")
    check(out, want)


def test_torchrun_without_run_id(tmp_path):
    """torchrun --standalone and older torch.distributed.launch: RANK and LOCAL_RANK suffice."""
    out = tmp_path / "t"
    env = torchrun_env(1, 2, 1, 0, 2)
    del env["TORCHELASTIC_RUN_ID"]
    pid = traced(out, env)
    check(out, {pid: (1, 2, 1, "torchrun")})


def test_no_launcher(tmp_path):
    """No launcher variables: r- in the name, rank/world_size/local_rank null in the header."""
    out = tmp_path / "t"
    pid = traced(out, {})
    cap = read_capture(out)
    (name,) = [p.name for p in out.iterdir()]
    assert f".{pid}.r-." in name
    h = cap.processes[0].header
    assert (h["rank"], h["world_size"], h["local_rank"]) == (None, None, None), h


def test_mpirun_variables_win_over_slurm(tmp_path):
    """mpirun inside an salloc/sbatch allocation: the job's SLURM_* are inherited, Open MPI's rank is the rank."""
    out = tmp_path / "t"
    env = srun_env(0, 1, 0)
    env.update(OMPI_COMM_WORLD_RANK=1, OMPI_COMM_WORLD_SIZE=2, OMPI_COMM_WORLD_LOCAL_RANK=1)
    pid = traced(out, env)
    check(out, {pid: (1, 2, 1, "mpirun")})


def test_torchrun_under_srun(tmp_path):
    """srun starts one task per node, torchrun in it spawns the workers: each worker inherits its node's
    SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID (the agent's), and torchrun's RANK/WORLD_SIZE/LOCAL_RANK are the
    worker's own (native/src/core/process.c: the innermost launcher wins)."""
    out = tmp_path / "t"
    want = {}
    for local in range(2):
        env = srun_env(1, 2, 0, nodeid=1)        # node 1's srun task
        env.update(torchrun_env(2 + local, 4, local, 1, 2))
        pid = traced(out, env)
        want[pid] = (2 + local, 4, local, "torchrun")
    check(out, want)


def test_torchrun_without_run_id_under_srun(tmp_path):
    """torch.distributed.launch (no TORCHELASTIC_RUN_ID) in an srun task: RANK/LOCAL_RANK still the worker's."""
    out = tmp_path / "t"
    env = srun_env(1, 2, 0, nodeid=1)
    t = torchrun_env(3, 4, 1, 1, 2)
    del t["TORCHELASTIC_RUN_ID"]
    env.update(t)
    pid = traced(out, env)
    check(out, {pid: (3, 4, 1, "torchrun")})


def test_torchrun_under_mpirun(tmp_path):
    """torchrun's agent started as an mpirun rank: its workers inherit the agent's OMPI_COMM_WORLD_*; the
    elastic agent's TORCHELASTIC_RUN_ID says the RANK/WORLD_SIZE/LOCAL_RANK beside them are the worker's."""
    out = tmp_path / "t"
    env = {"OMPI_COMM_WORLD_RANK": 1, "OMPI_COMM_WORLD_SIZE": 2, "OMPI_COMM_WORLD_LOCAL_RANK": 0}
    env.update(torchrun_env(3, 4, 1, 1, 2))
    pid = traced(out, env)
    check(out, {pid: (3, 4, 1, "torchrun")})


def test_mpirun_rank_exported_as_rank(tmp_path):
    """A job script under mpirun that exports RANK/LOCAL_RANK itself (no TORCHELASTIC_RUN_ID): Open MPI's
    variables are the rank, world size and local rank, all three from them."""
    out = tmp_path / "t"
    env = {"OMPI_COMM_WORLD_RANK": 1, "OMPI_COMM_WORLD_SIZE": 2, "OMPI_COMM_WORLD_LOCAL_RANK": 1,
           "RANK": 7, "LOCAL_RANK": 5, "WORLD_SIZE": 9}
    pid = traced(out, env)
    check(out, {pid: (1, 2, 1, "mpirun")})


def test_srun_with_pmix(tmp_path):
    """srun --mpi=pmix: PMIX_RANK beside the task's SLURM_*; the PMIx rank, with Slurm's local rank and task
    count (PMIx exports neither), under the launcher name mpiexec."""
    out = tmp_path / "t"
    env = srun_env(3, 4, 1, nodeid=1)
    env.update(PMIX_RANK=3, PMIX_NAMESPACE="slurm.pmix.4242.0")
    pid = traced(out, env)
    check(out, {pid: (3, 4, 1, "mpiexec")})
