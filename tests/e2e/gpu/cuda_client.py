"""A tiny CUDA client over the driver API (ctypes on libcuda), reporting what it saw as JSON.

Used by the GPU end-to-end tests as an MPS client; needs only the NVIDIA driver, no toolkit or torch.
Usage:
  python cuda_client.py <MiB> [hold_seconds]   allocate N MiB; alloc_result 0 = success, 2 = out of memory
  python cuda_client.py smid <blocks>          run <blocks> one-thread blocks that each spin ~1 ms and record the
                                               SM they ran on (%smid); report how many distinct SMs ran them
                                               and how many the GPU has (an MPS thread percentage bounds the
                                               first)
"""

from __future__ import annotations

import ctypes
import json
import sys
import time

# PTX compiled by the driver's JIT: each block spins on %clock64 so that blocks stay resident together, then
# writes %smid at out[%ctaid.x].
SMID_PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry smid(.param .u64 out)
{
  .reg .u32 %r<3>;
  .reg .u64 %rd<4>;
  .reg .s64 %t<3>;
  .reg .pred %p;
  mov.u64 %t1, %clock64;
SPIN:
  mov.u64 %t2, %clock64;
  sub.s64 %t2, %t2, %t1;
  setp.lt.s64 %p, %t2, 2000000;
  @%p bra SPIN;
  ld.param.u64 %rd1, [out];
  cvta.to.global.u64 %rd2, %rd1;
  mov.u32 %r1, %smid;
  mov.u32 %r2, %ctaid.x;
  mul.wide.u32 %rd3, %r2, 4;
  add.s64 %rd3, %rd2, %rd3;
  st.global.u32 [%rd3], %r1;
  ret;
}
"""
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16


def _context(cuda: ctypes.CDLL, out: dict[str, object]) -> int:
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    rc = cuda.cuInit(0)
    if rc == 0:
        rc = cuda.cuDeviceGet(ctypes.byref(dev), 0)
    if rc == 0:
        rc = cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
        out["ctx_result"] = rc
    if rc == 0:
        sms = ctypes.c_int()
        cuda.cuDeviceGetAttribute(ctypes.byref(sms), CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)
        out["total_sms"] = sms.value
    return int(rc)


def allocate(cuda: ctypes.CDLL, mib: int, hold: float, out: dict[str, object]) -> None:
    out["mib"] = mib
    if _context(cuda, out) != 0:
        return
    ptr = ctypes.c_uint64()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib * 1024 * 1024))
    out["alloc_result"] = rc  # 0 = CUDA_SUCCESS, 2 = CUDA_ERROR_OUT_OF_MEMORY
    if rc == 0:
        time.sleep(hold)


def sm_ids(cuda: ctypes.CDLL, blocks: int, out: dict[str, object]) -> None:
    if _context(cuda, out) != 0:
        return
    module, fn, dptr = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint64()
    steps = [
        ("load", lambda: cuda.cuModuleLoadData(ctypes.byref(module), SMID_PTX)),
        ("function", lambda: cuda.cuModuleGetFunction(ctypes.byref(fn), module, b"smid")),
        ("alloc", lambda: cuda.cuMemAlloc_v2(ctypes.byref(dptr), ctypes.c_size_t(4 * blocks))),
    ]
    for name, step in steps:
        rc = step()
        if rc != 0:
            out[f"{name}_result"] = rc
            return
    arg = ctypes.c_uint64(dptr.value)
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(arg), ctypes.c_void_p))
    rc = cuda.cuLaunchKernel(fn, blocks, 1, 1, 1, 1, 1, 0, None, params, None)
    if rc == 0:
        rc = cuda.cuCtxSynchronize()
    out["launch_result"] = rc
    if rc != 0:
        return
    host = (ctypes.c_uint32 * blocks)()
    out["copy_result"] = cuda.cuMemcpyDtoH_v2(host, dptr, ctypes.c_size_t(4 * blocks))
    out["sms"] = len(set(host))


def main() -> int:
    cuda = ctypes.CDLL("libcuda.so.1")
    out: dict[str, object] = {}
    if sys.argv[1] == "smid":
        sm_ids(cuda, int(sys.argv[2]), out)
    else:
        allocate(cuda, int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 0.0, out)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
