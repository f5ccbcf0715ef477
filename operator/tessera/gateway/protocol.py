"""Open Inference Protocol (KServe v2) JSON tensors: validation, decoding to numpy and encoding back.

The REST form of the protocol (kserve/open-inference-protocol, ``required_api.md``): a request is
``{"id"?, "parameters"?, "inputs": [{"name", "shape", "datatype", "data", "parameters"?}], "outputs"?}``;
``data`` holds the tensor in row-major order, flat or nested. A response is ``{"model_name", "id"?,
"outputs": [...], "parameters"?}``; an error is ``{"error": "<message>"}``. BYTES tensors are not
supported by the worker runtime (numeric models only) and are refused with a clear message.

JSON is parsed and written with orjson: numpy arrays are serialised straight from their buffer
(``OPT_SERIALIZE_NUMPY``), which is what keeps the gateway's and the worker's per-request cost small.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson

# v2 datatype name -> numpy dtype (required_api.md "Tensor Data Types").
DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
_BY_DTYPE = {v: k for k, v in DATATYPES.items()}


_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def loads(raw: bytes | str) -> Any:
    """Parse JSON; raises ``ValueError`` (``orjson.JSONDecodeError``) on malformed input."""
    return orjson.loads(raw)


def dumps(obj: Any) -> bytes:
    """JSON bytes; numpy arrays inside ``obj`` are written from their buffers."""
    try:
        return orjson.dumps(obj, option=_NUMPY)
    except TypeError:  # e.g. a non-contiguous or exotic-dtype array: the slow, general path
        return orjson.dumps(obj, option=_NUMPY, default=_to_list)


def _to_list(obj: Any) -> Any:
    if isinstance(obj, np.ndarray | np.generic):
        return obj.tolist()
    raise TypeError(f"cannot write {type(obj).__name__} as JSON")


class ProtocolError(ValueError):
    """A request that does not follow the v2 protocol; the message says what to fix (HTTP 400)."""


def validate_request(body: Any) -> list[dict[str, Any]]:
    """Check the structure of a v2 inference request and return its ``inputs``.

    Cheap (no tensor decoding), so the gateway can refuse malformed requests before queueing them.
    """
    if not isinstance(body, dict):
        raise ProtocolError("inference request must be a JSON object with an 'inputs' list")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ProtocolError("inference request needs a non-empty 'inputs' list")
    names: set[str] = set()
    for i, t in enumerate(inputs):
        where = f"inputs[{i}]"
        if not isinstance(t, dict):
            raise ProtocolError(f"{where} must be an object with name, shape, datatype and data")
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise ProtocolError(f"{where} needs a non-empty string 'name'")
        if name in names:
            raise ProtocolError(f"input {name!r} appears twice")
        names.add(name)
        shape = t.get("shape")
        if (
            not isinstance(shape, list)
            or not shape
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise ProtocolError(f"input {name!r}: 'shape' must be a non-empty list of integers >= 0")
        dt = t.get("datatype")
        if dt == "BYTES":
            raise ProtocolError(f"input {name!r}: BYTES tensors are not supported; send numeric tensors")
        if dt not in DATATYPES:
            raise ProtocolError(f"input {name!r}: unknown datatype {dt!r}; use one of {sorted(DATATYPES)}")
        if "data" not in t:
            raise ProtocolError(f"input {name!r} has no 'data'")
    return inputs


def rows(inputs: Sequence[Mapping[str, Any]]) -> int:
    """The batch dimension shared by all inputs of one request (their first dimension)."""
    sizes = {int(t["shape"][0]) for t in inputs}
    if len(sizes) != 1:
        raise ProtocolError(f"all inputs of a request must share their first (batch) dimension, got {sizes}")
    return sizes.pop()


def decode_tensor(t: Mapping[str, Any]) -> np.ndarray:
    """A validated v2 input tensor as a numpy array of its shape and datatype."""
    name, shape, dtype = t["name"], [int(d) for d in t["shape"]], DATATYPES[t["datatype"]]
    try:
        arr = np.asarray(t["data"], dtype=dtype)
    except (TypeError, ValueError) as err:
        raise ProtocolError(f"input {name!r}: data is not a {t['datatype']} array ({err})") from None
    if arr.size != math.prod(shape):
        raise ProtocolError(f"input {name!r}: shape {shape} needs {math.prod(shape)} values, got {arr.size}")
    return arr.reshape(shape)


def encode_tensor(name: str, arr: np.ndarray) -> dict[str, Any]:
    """A numpy array as a v2 output tensor (flat, row-major data)."""
    dt = _BY_DTYPE.get(arr.dtype)
    if dt is None:
        raise ProtocolError(f"output {name!r} has dtype {arr.dtype}, which the v2 protocol cannot carry")
    return {"name": name, "shape": list(arr.shape), "datatype": dt, "data": arr.ravel().tolist()}


def output_tensor(name: str, arr: np.ndarray) -> dict[str, Any]:
    """Like :func:`encode_tensor`, but ``data`` stays a flat numpy array for :func:`dumps` to write."""
    dt = _BY_DTYPE.get(arr.dtype)
    if dt is None:
        raise ProtocolError(f"output {name!r} has dtype {arr.dtype}, which the v2 protocol cannot carry")
    return {"name": name, "shape": list(arr.shape), "datatype": dt, "data": np.ascontiguousarray(arr).ravel()}


def error_body(message: str, reason: str | None = None) -> dict[str, Any]:
    """A v2 error object; ``reason`` is a machine-readable cause (e.g. a scheduler drop reason)."""
    out: dict[str, Any] = {"error": message}
    if reason is not None:
        out["reason"] = reason
    return out
