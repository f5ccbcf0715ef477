"""A tiny CUDA client over the driver API (ctypes on libcuda): allocate N MiB, report the CUDA result as JSON.

Used by the GPU end-to-end tests as an MPS client; needs only the NVIDIA driver, no toolkit or torch.
Usage: python cuda_client.py <MiB> [hold_seconds]
"""

from __future__ import annotations

import ctypes
import json
import sys
import time


def main() -> int:
    mib = int(sys.argv[1])
    hold = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    cuda = ctypes.CDLL("libcuda.so.1")
    out: dict[str, object] = {"mib": mib}
    rc = cuda.cuInit(0)
    dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    if rc == 0:
        rc = cuda.cuDeviceGet(ctypes.byref(dev), 0)
    if rc == 0:
        rc = cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
        out["ctx_result"] = rc
    if rc == 0:
        rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib * 1024 * 1024))
        out["alloc_result"] = rc  # 0 = CUDA_SUCCESS, 2 = CUDA_ERROR_OUT_OF_MEMORY
        if rc == 0:
            time.sleep(hold)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
