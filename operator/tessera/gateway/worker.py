"""Worker runtime: one ONNX model behind the Open Inference Protocol, running the batches a gateway forms.

A worker runs one batch at a time, non-preemptively (Orloj §3.2 "Workers"), on ONNX Runtime — the
CUDA execution provider when the installed build has it, the CPU one otherwise. It serves:

* the standard v2 endpoints for its model (``/v2/health/*``, ``/v2/models/{name}[/ready]``,
  ``POST /v2/models/{name}/infer``), so a client can call it directly;
* ``POST /v2/models/{name}/batch`` (Tessera extension): ``{"requests": [<v2 request>...], "solo": bool}``.
  Members are concatenated along their first dimension (grouped by their other dimensions), run as one
  batch, and split back. The answer carries one result per member (outputs, or an error for that member
  alone) and the timings the gateway needs: ``compute_seconds`` for the batch, ``queue_seconds`` spent
  waiting for the previous batch, and with ``solo: true`` each member run alone with its
  ``solo_seconds`` — the profiler's solo re-execution of Orloj §3.2. With ``x-tessera-framing:
  members`` the answer is framed as :mod:`tessera.gateway.batch_wire` describes, so the gateway can pass
  each member's outputs through unparsed.

A :class:`ModelledCost` (``tessera worker --pace-*``) makes a run last at least a modelled time that
depends on the input, padding the real run with a sleep: the ONNX model still computes every output, but
the time the schedulers plan around is the model's, not the noise of a shared CPU.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from aiohttp import web

from tessera.gateway.batch_wire import (
    COMPUTE_HEADER,
    FRAMING_HEADER,
    FRAMING_MEMBERS,
    MEMBERS_HEADER,
    QUEUE_HEADER,
    SOLO_HEADER,
    WORKER_MAX_BODY,
    frame_members,
)
from tessera.gateway.http_errors import json_error
from tessera.gateway.protocol import (
    DATATYPES,
    HEADER_LENGTH,
    MODEL_VERSIONS,
    ProtocolError,
    binary_outputs,
    binary_size,
    decode_tensor,
    dumps,
    error_body,
    error_json,
    loads,
    output_tensor,
    split_body,
    tensor_bytes,
    validate_request,
)
from tessera.gateway.v2_routes import ModelNotFound, V2Server, json_response

if TYPE_CHECKING:
    from tessera.gateway.pipeline import PipelinedModel

log = logging.getLogger(__name__)

# onnxruntime tensor type -> v2 datatype
_ORT_TYPES = {f"tensor({k})": v for k, v in {
    "bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
    "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
    "float16": "FP16", "float": "FP32", "double": "FP64",
}.items()}  # fmt: skip


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]  # -1 for a dynamic dimension

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True)
class ModelledCost:
    """A run lasts at least ``fixed_s + unit_s · max(input) · (1 + growth · (rows − 1))`` seconds.

    ``input`` names an integer model input holding each row's amount of work (the early-exit model's
    ``n``): the batch pays for its longest row, padded (Orloj Eq. 4), and each extra row
    stretches it by ``growth`` (s_k = 1 + growth·(k − 1), a batching model of Tessera's
    choosing).
    """

    input: str
    unit_s: float
    growth: float = 0.0
    fixed_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.unit_s >= 0 or not self.growth >= 0 or not self.fixed_s >= 0:
            raise ValueError(
                f"modelled cost needs unit, growth and fixed >= 0, got {self.unit_s}, {self.growth}, {self.fixed_s}"
            )

    def seconds(self, feeds: Mapping[str, np.ndarray]) -> float:
        work = feeds[self.input]
        rows = int(work.shape[0]) if work.ndim else 1
        if rows == 0:
            return 0.0
        longest = max(0.0, float(np.max(work)))
        return self.fixed_s + self.unit_s * longest * (1.0 + self.growth * (rows - 1))


@dataclass
class MemberResult:
    outputs: list[dict[str, Any]] | None = None
    error: str | None = None
    blobs: list[bytes] | None = None  # raw bytes of the binary outputs, in output order

    def as_json(self) -> dict[str, Any]:
        if self.error is not None:
            return error_body(self.error, status=400)
        return {"outputs": self.outputs}

    def fragment(self) -> tuple[int, bytes, bytes]:
        """(status, JSON, binary) of this member for a framed answer: its outputs list and the bytes of
        its binary outputs, or its error object."""
        if self.error is not None:
            return 400, error_json(self.error, status=400), b""
        return 200, dumps(self.outputs), b"".join(self.blobs or ())


@dataclass(frozen=True)
class Member:
    """One request of a batch: its v2 JSON body and the binary bytes that followed it."""

    body: Any
    blob: bytes = b""


@dataclass
class BatchResult:
    results: list[MemberResult]
    compute_seconds: float
    solo_seconds: list[float | None] | None = None


def _spec(meta: Any) -> TensorSpec:
    dt = _ORT_TYPES.get(meta.type)
    if dt is None:
        raise ValueError(f"model tensor {meta.name!r} has type {meta.type}, which the worker cannot serve")
    shape = tuple(d if isinstance(d, int) else -1 for d in meta.shape)
    return TensorSpec(meta.name, dt, shape)


class OnnxModel:
    """An ONNX Runtime session with batch execution over v2 tensors. Thread-compatible, not thread-safe:
    the worker calls it from one executor thread."""

    def __init__(
        self,
        path: str | Path,
        *,
        name: str | None = None,
        threads: int = 1,
        provider: str = "auto",
        cost: ModelledCost | None = None,
        stages: int = 1,
        layers: int | None = None,
    ):
        import onnxruntime as ort  # type: ignore[import-untyped]  # only workers need onnxruntime

        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"model file {p} does not exist")
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        available = ort.get_available_providers()
        if provider == "auto":
            providers = [x for x in ("CUDAExecutionProvider", "CPUExecutionProvider") if x in available]
        elif provider in available:
            providers = [provider]
        else:
            raise ValueError(f"execution provider {provider!r} is not available; this build has {available}")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(p), opts, providers=providers)
        self.name = name or p.stem
        self.providers = list(self.session.get_providers())
        self.inputs = [_spec(m) for m in self.session.get_inputs()]
        self.outputs = [_spec(m) for m in self.session.get_outputs()]
        self._input_names = {s.name: s for s in self.inputs}
        self.ranges = _ranges(self.session.get_modelmeta().custom_metadata_map, self._input_names)
        if cost is not None:
            spec = self._input_names.get(cost.input)
            if spec is None or not spec.datatype.startswith(("INT", "UINT")):
                ints = sorted(s.name for s in self.inputs if s.datatype.startswith(("INT", "UINT")))
                raise ValueError(
                    f"modelled cost input {cost.input!r} must be an integer input of the model; it has {ints}"
                )
        self.cost = cost
        # A pool group with pp > 1 (AlpaServe inter-op): the model cut into stage graphs, one session per
        # stage (stage k on the group's k-th GPU); requests then pass the stages first come, first served.
        self.pipeline: PipelinedModel | None = None
        if stages > 1:
            from tessera.gateway.pipeline import PipelinedModel

            self.pipeline = PipelinedModel(
                p, stages=stages, layers=layers, provider=self.providers[0], threads=threads,
                devices=list(range(stages)) if self.providers[0] == "CUDAExecutionProvider" else None,
            )  # fmt: skip
        log.info("loaded %s from %s on %s (%d stage(s))", self.name, p, self.providers, stages)

    @property
    def stages(self) -> int:
        return len(self.pipeline.stages) if self.pipeline is not None else 1

    def run_stage(self, k: int, env: dict[str, np.ndarray], pad_s: float) -> None:
        """Stage ``k`` of a pipelined model on ``env`` (activations handed on in place), lasting at least
        ``pad_s`` (the modelled cost's share of this stage)."""
        assert self.pipeline is not None
        start = time.perf_counter()
        self.pipeline._stage(k, env)
        rest = start + pad_s - time.perf_counter()
        if rest > 0:
            time.sleep(rest)

    def prepare(self, m: Member) -> tuple[dict[str, np.ndarray], tuple[list[str], set[str]]]:
        """One member's decoded, checked inputs and the outputs it wants (ProtocolError if refused)."""
        inputs = validate_request(m.body, len(m.blob))
        feeds = self.decode(inputs, m.blob)
        if len({a.shape[0] for a in feeds.values()}) != 1:
            raise ProtocolError("all inputs of a request must share their first (batch) dimension")
        return feeds, binary_outputs(m.body, [o.name for o in self.outputs])

    def metadata(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "versions": ["1"],
            "platform": "onnxruntime_onnx",
            "inputs": [s.as_json() for s in self.inputs],
            "outputs": [s.as_json() for s in self.outputs],
        }

    def decode(self, inputs: Sequence[Mapping[str, Any]], blob: bytes = b"") -> dict[str, np.ndarray]:
        """One request's inputs as arrays, checked against the model's inputs (``blob``: the bytes of
        its binary inputs, in input order)."""
        given = {str(t["name"]): t for t in inputs}
        missing = sorted(set(self._input_names) - set(given))
        extra = sorted(set(given) - set(self._input_names))
        if missing or extra:
            raise ProtocolError(
                f"model {self.name!r} takes inputs {sorted(self._input_names)}; missing {missing}, unknown {extra}"
            )
        blobs: dict[str, bytes] = {}
        at = 0
        for t in inputs:
            size = binary_size(t)
            if size is not None:
                blobs[str(t["name"])] = blob[at : at + size]
                at += size
        out: dict[str, np.ndarray] = {}
        for name, spec in self._input_names.items():
            t = given[name]
            if t["datatype"] != spec.datatype:
                raise ProtocolError(f"input {name!r} must be {spec.datatype}, got {t['datatype']}")
            arr = decode_tensor(t, blobs.get(name))
            if name in self.ranges and arr.size:
                lo, hi = self.ranges[name]
                if float(arr.min()) < lo or float(arr.max()) > hi:
                    raise ProtocolError(f"input {name!r}: values must lie in [{lo:g}, {hi:g}]")
            if arr.ndim != len(spec.shape) or any(
                want not in (-1, got) for want, got in zip(spec.shape, arr.shape, strict=True)
            ):
                raise ProtocolError(
                    f"input {name!r} has shape {list(arr.shape)}, model expects {list(spec.shape)}"
                )
            out[name] = arr
        return out

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        start = time.perf_counter()
        if self.pipeline is not None:
            outs = [np.asarray(a) for a in self.pipeline.run(feeds)]
        else:
            outs = [np.asarray(a) for a in self.session.run(None, dict(feeds))]
        if self.cost is not None:
            rest = start + self.cost.seconds(feeds) - time.perf_counter()
            if rest > 0:
                time.sleep(rest)
        return outs

    def _emit(
        self, result: MemberResult, outs: Sequence[np.ndarray], want: tuple[list[str], set[str]]
    ) -> None:
        """Fill one member's outputs: those it asked for, binary ones as raw bytes."""
        by_name = {o.name: a for o, a in zip(self.outputs, outs, strict=True)}
        names, binary = want
        tensors: list[dict[str, Any]] = []
        blobs: list[bytes] = []
        for name in names:
            if name in binary:
                raw = tensor_bytes(by_name[name])
                t = output_tensor(name, by_name[name])
                del t["data"]
                t["parameters"] = {"binary_data_size": len(raw)}
                tensors.append(t)
                blobs.append(raw)
            else:
                tensors.append(output_tensor(name, by_name[name]))
        result.outputs, result.blobs = tensors, blobs

    def run_batch(self, members: Sequence[Member], *, solo: bool = False) -> BatchResult:
        """Run every member; members with the same non-batch dimensions share one run. A member that
        fails its checks gets its own error and the others still run."""
        results = [MemberResult() for _ in members]
        decoded: dict[int, dict[str, np.ndarray]] = {}
        wants: dict[int, tuple[list[str], set[str]]] = {}
        for i, m in enumerate(members):
            try:
                decoded[i], wants[i] = self.prepare(m)
            except ProtocolError as err:
                results[i].error = str(err)
                decoded.pop(i, None)
        t0 = time.perf_counter()
        solo_times: list[float | None] | None = None
        if solo:
            solo_times = [None] * len(members)
            for i, feeds in decoded.items():
                s = time.perf_counter()
                outs = self.run(feeds)
                solo_times[i] = time.perf_counter() - s
                self._emit(results[i], outs, wants[i])
        else:
            groups: dict[tuple[tuple[str, tuple[int, ...]], ...], list[int]] = {}
            for i, feeds in decoded.items():
                key = tuple(sorted((n, a.shape[1:]) for n, a in feeds.items()))
                groups.setdefault(key, []).append(i)
            for idx in groups.values():
                feeds = {n: np.concatenate([decoded[i][n] for i in idx]) for n in decoded[idx[0]]}
                try:
                    outs = self.run(feeds)
                except Exception as err:  # the runtime refused an input: find whose, run the rest
                    log.warning("batch of %d failed (%s); running its members alone", len(idx), err)
                    for i in idx:
                        try:
                            self._emit(results[i], self.run(decoded[i]), wants[i])
                        except Exception as one:
                            results[i].error = f"the model could not run this input: {one}"
                    continue
                start = 0
                for i in idx:
                    k = next(iter(decoded[i].values())).shape[0]
                    self._emit(results[i], [a[start : start + k] for a in outs], wants[i])
                    start += k
        return BatchResult(results, time.perf_counter() - t0, solo_times)


RANGE_PREFIX = "tessera.range."


def _ranges(meta: Mapping[str, str], inputs: Mapping[str, TensorSpec]) -> dict[str, tuple[float, float]]:
    """Value ranges a model declares for its inputs (ONNX metadata ``tessera.range.<input>`` =
    ``"lo:hi"``), which the worker checks so that an input the model cannot take is a 400."""
    out: dict[str, tuple[float, float]] = {}
    for key, value in meta.items():
        if not key.startswith(RANGE_PREFIX):
            continue
        name = key[len(RANGE_PREFIX) :]
        try:
            lo, hi = (float(v) for v in value.split(":"))
        except ValueError:
            raise ValueError(f"model metadata {key}={value!r} is not 'lo:hi'") from None
        if name not in inputs:
            raise ValueError(f"model metadata {key} names no input; inputs: {sorted(inputs)}")
        out[name] = (lo, hi)
    return out


class Worker:
    """Serves one :class:`OnnxModel`, or every model of a pool group (AlpaServe: the group's GPUs hold all
    its models). Batches run one at a time on a single executor thread, first come, first served across
    the models. Single requests for pipelined models pass the stages instead: stage k of every model
    shares one lock and one thread (its GPU), and a request takes stage k+1's lock before it lets go of
    stage k's, so requests keep their order and overlap, one per stage (the FCFS pipeline the planner
    simulates)."""

    def __init__(self, model: OnnxModel, *more: OnnxModel) -> None:
        self.model = model
        self.models = {m.name: m for m in (model, *more)}
        if len(self.models) != 1 + len(more):
            raise ValueError(f"model names must be unique, got {[m.name for m in (model, *more)]}")
        self._lock = asyncio.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tessera-worker")
        depth = max(m.stages for m in self.models.values())
        self._stage_locks = [asyncio.Lock() for _ in range(depth)]
        self._stage_pools = [
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"tessera-stage{k}")
            for k in range(depth)
        ]
        self.batches = 0

    async def execute(
        self, members: Sequence[Member], solo: bool, model: OnnxModel | None = None
    ) -> tuple[BatchResult, float]:
        m = model or self.model
        if m.pipeline is not None and len(members) == 1 and not solo:
            return await self._staged(m, members[0])
        arrived = time.perf_counter()
        async with self._lock:
            queued = time.perf_counter() - arrived
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(self._pool, lambda: m.run_batch(members, solo=solo))
            self.batches += 1
        return result, queued

    async def _staged(self, model: OnnxModel, member: Member) -> tuple[BatchResult, float]:
        result = MemberResult()
        try:
            feeds, want = model.prepare(member)
        except ProtocolError as err:
            result.error = str(err)
            return BatchResult([result], 0.0, None), 0.0
        assert model.pipeline is not None
        pp = model.stages
        pad = model.cost.seconds(feeds) / pp if model.cost is not None else 0.0
        env = dict(feeds)
        loop = asyncio.get_running_loop()
        arrived = time.perf_counter()
        first = self._stage_locks[0]
        await first.acquire()
        held: asyncio.Lock | None = first
        queued = time.perf_counter() - arrived
        try:
            for k in range(pp):
                await loop.run_in_executor(self._stage_pools[k], model.run_stage, k, env, pad)
                nxt = self._stage_locks[k + 1] if k + 1 < pp else None
                if nxt is not None:
                    await nxt.acquire()
                if held is not None:
                    held.release()
                held = nxt
        except Exception as err:
            result.error = f"the model could not run this input: {err}"
            return BatchResult([result], time.perf_counter() - arrived - queued, None), queued
        finally:
            if held is not None and held.locked():
                held.release()
        model._emit(result, [env[o] for o in model.pipeline.output_names], want)
        self.batches += 1
        return BatchResult([result], time.perf_counter() - arrived - queued, None), queued

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for p in self._stage_pools:
            p.shutdown(wait=False, cancel_futures=True)


def _members(raw: bytes, header_length: str | None) -> tuple[list[Member], bool]:
    """The members of a batch body (JSON ``{"requests", "solo"}`` and, with the binary extension, the
    members' binary bytes back to back in member order) and its ``solo`` flag."""
    head, tail = split_body(raw, header_length)
    try:
        body = loads(head)
    except ValueError:
        raise ProtocolError("batch body is not valid JSON") from None
    reqs = body.get("requests") if isinstance(body, dict) else None
    if not isinstance(reqs, list) or not reqs:
        raise ProtocolError("batch body needs a non-empty 'requests' list")
    members: list[Member] = []
    at = 0
    for r in reqs:
        size = 0
        inputs = r.get("inputs") if isinstance(r, dict) else None
        for t in inputs if isinstance(inputs, list) else []:
            n = binary_size(t) if isinstance(t, dict) else None
            size += n if isinstance(n, int) and n > 0 else 0
        members.append(Member(r, tail[at : at + size]))
        at += size
    if at != len(tail):
        raise ProtocolError(f"the members' binary_data_size add up to {at} bytes, {len(tail)} were sent")
    return members, bool(body.get("solo", False))


class _WorkerEndpoints(V2Server):
    """The worker's v2 answers for the models it serves, and the batch extension."""

    server_name = "tessera-worker"
    extensions = ("binary_tensor_data", "tessera_batch")

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def model(self, request: web.Request) -> OnnxModel:
        """The model (and version) a request's path names; a JSON 404 if this worker does not serve it."""
        name = request.match_info["name"]
        found = self.worker.models.get(name)
        if found is None:
            served = ", ".join(repr(n) for n in self.worker.models)
            raise ModelNotFound(f"model {name!r} is not served here; this worker serves {served}")
        version = request.match_info.get("version")
        if version is not None and version not in MODEL_VERSIONS:
            raise ModelNotFound(
                f"model {name!r} has no version {version!r}; versions: {list(MODEL_VERSIONS)}"
            )
        return found

    async def ready(self, request: web.Request) -> web.Response:
        return await self.live(request)  # a worker is ready once its models are loaded, i.e. once it runs

    async def model_meta(self, request: web.Request) -> web.Response:
        return json_response(self.model(request).metadata())

    async def model_ready(self, request: web.Request) -> web.Response:
        return json_response({"name": self.model(request).name, "ready": True})

    async def infer(self, request: web.Request) -> web.Response:
        model = self.model(request)
        try:
            head, blob = split_body(await request.read(), request.headers.get(HEADER_LENGTH))
            body = loads(head)
        except ProtocolError as err:
            return json_error(400, str(err))
        except ValueError:
            return json_error(400, "request body is not valid JSON")
        try:
            validate_request(body, len(blob))
        except ProtocolError as err:
            return json_error(400, str(err))
        result, queued = await self.worker.execute([Member(body, blob)], solo=False, model=model)
        member = result.results[0]
        if member.error is not None:
            return json_error(400, member.error)
        return _infer_response(model, body, member, result.compute_seconds, queued)

    async def batch(self, request: web.Request) -> web.Response:
        model = self.model(request)
        try:
            members, solo = _members(await request.read(), request.headers.get(HEADER_LENGTH))
        except ProtocolError as err:
            return json_error(400, str(err))
        result, queued = await self.worker.execute(members, solo=solo, model=model)
        if request.headers.get(FRAMING_HEADER) == FRAMING_MEMBERS:
            return _framed_batch_response(result, queued)
        return json_response(
            {
                "model_name": model.name,
                "results": [m.as_json() for m in result.results],
                "compute_seconds": result.compute_seconds,
                "queue_seconds": queued,
                "solo_seconds": result.solo_seconds,
            }
        )

    async def on_cleanup(self, _: web.Application) -> None:
        self.worker.close()


def _infer_response(
    model: OnnxModel, body: Mapping[str, Any], member: MemberResult, compute_s: float, queued: float
) -> web.Response:
    """A v2 inference answer for one request run alone, with the worker's timings as parameters; binary
    outputs follow the JSON header (binary tensor data extension)."""
    out: dict[str, Any] = {"model_name": model.name, "model_version": "1", "outputs": member.outputs}
    if isinstance(body.get("id"), str):
        out["id"] = body["id"]
    out["parameters"] = {"tessera_compute_seconds": compute_s, "tessera_queue_seconds": queued}
    header = dumps(out)
    if not member.blobs:
        return web.Response(body=header, content_type="application/json")
    return web.Response(
        body=header + b"".join(member.blobs),
        headers={HEADER_LENGTH: str(len(header))},
        content_type="application/octet-stream",
    )


def _framed_batch_response(result: BatchResult, queued: float) -> web.Response:
    """A batch answer framed per member (:mod:`tessera.gateway.batch_wire`), timings in headers."""
    payload, spec = frame_members([m.fragment() for m in result.results])
    headers = {
        MEMBERS_HEADER: spec,
        COMPUTE_HEADER: repr(result.compute_seconds),
        QUEUE_HEADER: repr(queued),
    }
    if result.solo_seconds is not None:
        headers[SOLO_HEADER] = ",".join("-" if t is None else repr(t) for t in result.solo_seconds)
    return web.Response(body=payload, headers=headers, content_type="application/octet-stream")


def make_worker_app(worker: Worker, *, max_body: int = WORKER_MAX_BODY) -> web.Application:
    """The worker's HTTP application: the v2 endpoints for its models and ``POST .../batch``."""
    endpoints = _WorkerEndpoints(worker)
    app = endpoints.application(
        max_body=max_body, extra=[web.post("/v2/models/{name}/batch", endpoints.batch)]
    )
    app.on_cleanup.append(endpoints.on_cleanup)
    return app


__all__ = [
    "DATATYPES",
    "BatchResult",
    "Member",
    "MemberResult",
    "ModelledCost",
    "OnnxModel",
    "TensorSpec",
    "Worker",
    "make_worker_app",
]
