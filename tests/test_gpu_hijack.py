"""GPU doorbell hijack on a real CUDA GPU over the emulated mlx5 HCA (marker gpu).

Run with `bash native/tests/run_gpu.sh` (docs/gpu.md).  A real kernel builds
WQEs, fences, writes the DBR and rings the 8-byte doorbell through the device
pointer the driver handed out; the tracer must have replaced it with its proxy
page, forwarded every doorbell (otherwise the kernel's quiet never returns),
recorded exactly the ground-truth doorbells and recovered every WQE.
"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sigmatrace import _native

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent


def _gpu_reason():
    if not (Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()):
        return "no NVIDIA GPU device node (/dev/nvidia0) on this machine"
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if not nvcc:
        return "nvcc not found (PATH or /usr/local/cuda/bin)"
    if not native_dir():
        return "native build with the emulated HCA missing (cmake -S native -B build/dev)"
    return None


def native_dir():
    for d in _native.candidate_dirs():
        if (d / "libsigmatrace.so").exists() and (d / "emu" / "libibverbs.so.1").exists():
            return d
    return None


def build_gpu_client(outdir):
    """Compile native/tests/gpu_ibgda_client.cu with nvcc; returns the binary's path."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    base = native_dir()
    out = Path(outdir) / "gpu_ibgda_client"
    stubs = [p for p in ("/usr/local/cuda/lib64/stubs", "/usr/local/cuda/targets/x86_64-linux/lib/stubs")
             if Path(p, "libcuda.so").exists()]
    cmd = [nvcc, "-O2", "-std=c++17", "-arch=native", f"-I{ROOT}/native/include",
           str(ROOT / "native/tests/gpu_ibgda_client.cu"), "-o", str(out), f"-L{base}/emu",
           *[f"-L{s}" for s in stubs], "-l:libmlx5.so.1", "-l:libibverbs.so.1", "-lcuda"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0 and "-arch=native" in cmd:
        cmd[cmd.index("-arch=native")] = "-arch=sm_90"
        p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def gpu_client(tmp_path_factory):
    why = _gpu_reason()
    if why:
        pytest.skip(why)
    return build_gpu_client(tmp_path_factory.mktemp("gpu"))


def run_gpu(tmp_path, client, op, api="runtime", mode="nonblocking", traced=True, iters=2000, warmup=100,
            extra=(), env_extra=None):
    from sigmatrace.format import read_capture
    base = native_dir()
    tr = tmp_path / f"trace-{op}-{api}-{mode}"
    tr.mkdir()
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.update(LD_LIBRARY_PATH=f"{base}/emu:" + env.get("LD_LIBRARY_PATH", ""), SIGMATRACE_OUTPUT_DIR=str(tr),
               SIGMATRACE_HIJACK_MODE=mode, SIGMATRACE_EMU_FABRIC=str(tmp_path / "fabric"))
    if traced:
        env["LD_PRELOAD"] = str(base / "libsigmatrace.so")
    env.update(env_extra or {})
    gt = tmp_path / f"gt-{op}-{api}-{mode}.txt"
    lat = tmp_path / f"lat-{op}-{api}-{mode}.txt"
    p = subprocess.run([str(client), "--op", op, "--api", api, "--iters", str(iters), "--warmup", str(warmup),
                        "--log", str(gt), "--lat", str(lat), *extra], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and "RESULT OK" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    files = sorted(tr.glob("*.trace"))
    return p.stdout, (read_capture([str(f) for f in files]) if files else None), gt.read_text().splitlines(), lat


@pytest.mark.parametrize("api", ["driver", "runtime"])
@pytest.mark.parametrize("op", ["put", "get", "fadd", "pingpong"])
def test_gpu_ops_traced(tmp_path, gpu_client, api, op):
    from test_hijack_emu import check_recovery, ground_truth, recorded_doorbells
    stdout, cap, gt, _ = run_gpu(tmp_path, gpu_client, op, api=api)
    dp = cap.table("CU_MEM_HOST_GET_DEVPTR")
    # cudart also asks for the device pointers of ordinary pinned buffers: only
    # the two doorbell pages may be (and must be) replaced.
    hijacked = dp["hijacked"] == 1
    assert hijacked.sum() == 2, "both doorbell pointers replaced, nothing else"
    assert all(dp["device_ptr"][hijacked] != dp["real_device_ptr"][hijacked])
    dbs_gt, wqes_gt = ground_truth(gt)
    per, _ = recorded_doorbells(cap)
    for qpn, pis in dbs_gt.items():
        assert per[qpn] == pis, f"qpn {qpn}: {len(per[qpn])} recorded vs {len(pis)} rung"
    if op != "pingpong":
        n, lost = check_recovery(cap, wqes_gt, allow_lost=True)
        print(f"\n[{api}/{op}] doorbells={sum(map(len, dbs_gt.values()))} wqes={n} lost={lost}")
        assert lost <= n // 100
    if api == "runtime":
        g = cap.table("CU_GET_PROC_ADDRESS")
        assert len(g["tsc"]) and any(g["wrapped"] == 1), "cudart reached the driver through cuGetProcAddress"


@pytest.mark.parametrize("mode", ["forward", "blocking", "sync", "guarded"])
def test_gpu_modes(tmp_path, gpu_client, mode):
    from test_hijack_emu import check_recovery, ground_truth, recorded_doorbells
    stdout, cap, gt, _ = run_gpu(tmp_path, gpu_client, "put", mode=mode, iters=1000)
    dbs_gt, wqes_gt = ground_truth(gt)
    per, _ = recorded_doorbells(cap)
    for qpn, pis in dbs_gt.items():
        assert per[qpn] == pis
    if mode != "forward":
        n, lost = check_recovery(cap, wqes_gt, allow_lost=(mode in ("blocking", "guarded")))
        assert lost == 0 or (mode == "blocking") or (mode == "guarded" and lost <= n // 100)


def test_gpu_managed_sq_uses_device_copies(tmp_path, gpu_client):
    """SQ in managed (GPU-resident) memory: the WQE copy is a cuMemcpyDtoHAsync on the tracer's stream."""
    from test_hijack_emu import check_recovery, ground_truth
    stdout, cap, gt, _ = run_gpu(tmp_path, gpu_client, "put", iters=500, extra=("--sq", "managed"))
    _, wqes_gt = ground_truth(gt)
    n, lost = check_recovery(cap, wqes_gt, allow_lost=True)
    assert n == 600 and lost <= 6


def test_gpu_untraced_baseline(tmp_path, gpu_client):
    stdout, cap, _, _ = run_gpu(tmp_path, gpu_client, "put", traced=False, iters=500)
    assert cap is None
