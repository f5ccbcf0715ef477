"""The gateway's gRPC front: the Open Inference Protocol's ``inference.GRPCInferenceService``
(``tessera.gateway.oip``, generated from the protocol's own .proto) beside the HTTP one.

Both fronts share :meth:`tessera.gateway.server.Gateway.infer`: a ``ModelInfer`` call is turned into
the HTTP form of the binary tensor data extension (a JSON header naming each input's
``binary_data_size``, then the raw little-endian bytes — ``raw_input_contents`` as they came, typed
``contents`` packed once) and queued on the same model queue, so batching, checks and errors are the
same. Every output comes back as ``raw_output_contents``. HTTP statuses map to gRPC codes (400
INVALID_ARGUMENT, 404 NOT_FOUND, 413 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED, 500
INTERNAL), the message is the JSON error's ``error`` and its ``reason`` travels in the trailing metadata
``tessera-reason``. The application tag and latency budget come from the same names as the HTTP headers,
as gRPC metadata.

Triton's extensions (:mod:`tessera.gateway.extensions`) are further methods of the same service —
``ModelConfig``, ``ModelStatistics``, ``RepositoryIndex`` and, refused, ``RepositoryModelLoad`` /
``RepositoryModelUnload`` — with the messages of ``oip/triton_extensions.proto``, registered beside the
protocol's generated handler; their content is the HTTP front's JSON, parsed into the messages.
"""

from __future__ import annotations

import time
from typing import Any

import grpc  # type: ignore[import-untyped]
import numpy as np
from google.protobuf import json_format  # type: ignore[import-untyped]

from tessera.api.contract import HEADER_DEADLINE_MS
from tessera.gateway.batch_wire import CLIENT_MAX_BODY
from tessera.gateway.extensions import MODEL_CONTROL_REFUSED, REASON_MODEL_CONTROL
from tessera.gateway.oip import open_inference_grpc_pb2 as pb
from tessera.gateway.oip import open_inference_grpc_pb2_grpc as pb_grpc
from tessera.gateway.oip import triton_extensions_pb2 as ext
from tessera.gateway.protocol import DATATYPES, dumps, loads
from tessera.gateway.server import SERVER_EXTENSIONS, Gateway, GatewayError
from tessera.gateway.service import Outcome

CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
REASON_KEY = "tessera-reason"

# v2 datatype -> the InferTensorContents field that carries it (FP16 has none: raw contents only).
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def _param(p: Any) -> Any:
    which = p.WhichOneof("parameter_choice")
    return getattr(p, which) if which else None


def _set_param(target: Any, value: Any) -> None:
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    else:
        target.string_param = str(value)


def to_binary_request(request: Any) -> tuple[bytes, bytes]:
    """(JSON header, binary bytes) of a ``ModelInferRequest`` in the binary tensor data extension."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise GatewayError(
            400,
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs; give one per input",
        )
    inputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for i, t in enumerate(request.inputs):
        if raw:
            blob = raw[i]
        else:
            field = _CONTENTS.get(t.datatype)
            if field is None or t.datatype not in DATATYPES:
                # Unknown or unsupported datatypes get the same message as over HTTP from the checks.
                blob = b""
            else:
                values = getattr(t.contents, field)
                blob = np.asarray(values, dtype=DATATYPES[t.datatype].newbyteorder("<")).tobytes()
        entry: dict[str, Any] = {"name": t.name, "shape": list(t.shape), "datatype": t.datatype}
        params = {k: _param(v) for k, v in t.parameters.items()}
        params["binary_data_size"] = len(blob)
        entry["parameters"] = params
        inputs.append(entry)
        blobs.append(blob)
    head: dict[str, Any] = {"inputs": inputs, "parameters": {"binary_data_output": True}}
    if request.id:
        head["id"] = request.id
    if request.outputs:
        head["outputs"] = [{"name": o.name, "parameters": {"binary_data": True}} for o in request.outputs]
    return dumps(head), b"".join(blobs)


def to_response(out: Outcome) -> Any:
    """A 200 :class:`Outcome` (JSON header and binary outputs) as a ``ModelInferResponse``."""
    n = out.header_length if out.header_length is not None else len(out.body)
    answer = loads(out.body[:n])
    resp = pb.ModelInferResponse(
        model_name=answer.get("model_name", ""),
        model_version=answer.get("model_version", ""),
        id=answer.get("id", ""),
    )
    at = n
    for o in answer["outputs"]:
        resp.outputs.add(name=o["name"], datatype=o["datatype"], shape=o["shape"])
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is None:  # a JSON output (not asked for here, but kept correct): pack its data
            data = np.asarray(o["data"], dtype=DATATYPES[o["datatype"]].newbyteorder("<"))
            resp.raw_output_contents.append(data.tobytes())
            continue
        resp.raw_output_contents.append(out.body[at : at + size])
        at += size
    for k, v in (answer.get("parameters") or {}).items():
        _set_param(resp.parameters[k], v)
    return resp


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def _abort(self, context: Any, out: Outcome) -> None:
        try:
            err = loads(out.body)
            message, reason = str(err.get("error", "")), str(err.get("reason", ""))
        except (ValueError, AttributeError):
            message, reason = out.body[:500].decode(errors="replace"), ""
        context.set_trailing_metadata(((REASON_KEY, reason),))
        await context.abort(CODES.get(out.status, grpc.StatusCode.UNKNOWN), message)

    async def _service(self, name: str, version: str, context: Any) -> Any:
        try:
            return self.gateway.service(name, version)
        except GatewayError as err:
            await self._abort(context, err.outcome())

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.gateway.ready)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        svc = await self._service(request.name, request.version, context)
        return pb.ModelReadyResponse(ready=svc.ready)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return pb.ServerMetadataResponse(name="tessera-gateway", version="1", extensions=SERVER_EXTENSIONS)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        svc = await self._service(request.name, request.version, context)
        meta = svc.metadata()
        resp = pb.ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"]
        )
        for key in ("inputs", "outputs"):
            for t in meta.get(key, []):
                getattr(resp, key).add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        return resp

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        arrived = time.perf_counter()
        try:
            head, blob = to_binary_request(request)
        except GatewayError as err:
            await self._abort(context, err.outcome())
        md = {k.lower(): v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        svc = self.gateway.services.get(request.model_name)
        app = md.get(svc.cfg.app_header.lower()) if svc is not None else None
        out = await self.gateway.infer(
            request.model_name,
            request.model_version,
            head,
            blob,
            app=app,
            deadline_ms=md.get(HEADER_DEADLINE_MS.lower()),
            arrived=arrived,
        )
        if out.status != 200:
            await self._abort(context, out)
        return to_response(out)


class ExtensionServicer:
    """Triton's extension methods of ``inference.GRPCInferenceService`` (module docstring)."""

    SERVICE = "inference.GRPCInferenceService"

    def __init__(self, inference: InferenceServicer) -> None:
        self.inference = inference
        self.gateway = inference.gateway

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        if not request.name:
            await self.inference._abort(
                context, GatewayError(400, "ModelConfigRequest needs the model's name").outcome()
            )
        svc = await self.inference._service(request.name, request.version, context)
        return ext.ModelConfigResponse(config=json_format.ParseDict(svc.model_config(), ext.ModelConfig()))

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        try:
            stats = self.gateway.model_stats(request.name, request.version)
        except GatewayError as err:
            await self.inference._abort(context, err.outcome())
        return json_format.ParseDict({"model_stats": stats}, ext.ModelStatisticsResponse())

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        if request.repository_name:
            err = GatewayError(
                404,
                f"no model repository {request.repository_name!r}: the gateway has one, "
                "named by an empty repository_name",
                "not-found",
            )
            await self.inference._abort(context, err.outcome())
        index = self.gateway.repository_index(ready_only=request.ready)
        return json_format.ParseDict({"models": index}, ext.RepositoryIndexResponse())

    async def RepositoryModelControl(self, request: Any, context: Any) -> Any:
        await self.inference._abort(
            context, GatewayError(400, MODEL_CONTROL_REFUSED, REASON_MODEL_CONTROL).outcome()
        )

    def handler(self) -> Any:
        """The generic handler serving these methods (the protocol's generated one knows only its own)."""

        def unary(behaviour: Any, request: Any, response: Any) -> Any:
            return grpc.unary_unary_rpc_method_handler(
                behaviour,
                request_deserializer=request.FromString,
                response_serializer=response.SerializeToString,
            )

        return grpc.method_handlers_generic_handler(
            self.SERVICE,
            {
                "ModelConfig": unary(self.ModelConfig, ext.ModelConfigRequest, ext.ModelConfigResponse),
                "ModelStatistics": unary(
                    self.ModelStatistics, ext.ModelStatisticsRequest, ext.ModelStatisticsResponse
                ),
                "RepositoryIndex": unary(
                    self.RepositoryIndex, ext.RepositoryIndexRequest, ext.RepositoryIndexResponse
                ),
                "RepositoryModelLoad": unary(
                    self.RepositoryModelControl,
                    ext.RepositoryModelLoadRequest,
                    ext.RepositoryModelLoadResponse,
                ),
                "RepositoryModelUnload": unary(
                    self.RepositoryModelControl,
                    ext.RepositoryModelUnloadRequest,
                    ext.RepositoryModelUnloadResponse,
                ),
            },
        )


async def start_grpc(gateway: Gateway, host: str, port: int) -> tuple[Any, int]:
    """Start the gRPC server on ``host:port`` (0: any free port); returns it and the bound port."""
    options = [
        ("grpc.max_receive_message_length", CLIENT_MAX_BODY),
        ("grpc.max_send_message_length", CLIENT_MAX_BODY),
    ]
    server = grpc.aio.server(options=options)
    servicer = InferenceServicer(gateway)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    server.add_generic_rpc_handlers((ExtensionServicer(servicer).handler(),))
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {host}:{port}")
    await server.start()
    return server, bound
