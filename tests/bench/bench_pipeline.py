"""Benchmark: the early-exit demo model unsplit and as 2/3/4 pipeline stages (gateway.pipeline), on CPU.

    .venv/bin/python tests/bench/bench_pipeline.py [--requests 60] [--width 512] [--layers 64]

Prints requests/s for the unsplit session, the stages run one after another (``run``) and the stages
overlapping across requests (``run_stream``, one thread per stage). Every session uses one intra-op
thread, so overlap is bounded by the machine's cores; it shows the stages run concurrently, not what a
group of GPUs gives. Outputs are checked equal to the unsplit model's.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort  # type: ignore[import-untyped]
from tessera.gateway.demo_models import early_exit_model
from tessera.gateway.pipeline import PipelinedModel


def best_of(f: Callable[[], object], repeat: int = 3) -> float:
    out = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        out = min(out, time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = early_exit_model(Path(tmp) / "ee.onnx", width=args.width, max_layers=args.layers)
        rng = np.random.default_rng(0)
        reqs = [
            {"x": rng.standard_normal((args.batch, args.width)).astype(np.float32),
             "n": np.full((args.batch, 1), args.layers, dtype=np.int64)}
            for _ in range(args.requests)
        ]  # fmt: skip
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        full = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        want = [full.run(None, r)[0] for r in reqs]
        base = best_of(lambda: [full.run(None, r) for r in reqs])
        print(f"{'stages':>6} {'run req/s':>10} {'stream req/s':>13} {'vs unsplit':>10}")
        print(f"{'1':>6} {len(reqs) / base:>10.1f} {'-':>13} {'1.00x':>10}")
        for k in (2, 3, 4):
            pm = PipelinedModel(path, stages=k, layers=args.layers, provider="CPUExecutionProvider")
            got = [o[0] for o in pm.run_stream(reqs)]
            assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)), "outputs differ"
            seq = best_of(lambda pm=pm: [pm.run(r) for r in reqs])
            st = best_of(lambda pm=pm: list(pm.run_stream(reqs)))
            print(f"{k:>6} {len(reqs) / seq:>10.1f} {len(reqs) / st:>13.1f} {base / st:>9.2f}x")


if __name__ == "__main__":
    main()
