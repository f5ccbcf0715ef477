"""Open Inference Protocol (KServe v2) JSON tensors: validation, decoding to numpy and encoding back.

The REST form of the protocol (kserve/open-inference-protocol, ``required_api.md``): a request is
``{"id"?, "parameters"?, "inputs": [{"name", "shape", "datatype", "data", "parameters"?}], "outputs"?}``;
``data`` holds the tensor in row-major order, flat or nested. A response is ``{"model_name", "id"?,
"outputs": [...], "parameters"?}``; an error is ``{"error": "<message>", "reason": "<cause>"}``, always
written by the JSON encoder. BYTES tensors are not supported by the worker runtime (numeric models only)
and are refused with a clear message.

Binary tensor data extension (KServe v2 / Triton ``binary_data``): with the header
``Inference-Header-Content-Length: n`` the first ``n`` bytes of the body are the JSON request and the rest
holds, in input order, the raw little-endian bytes of every input whose ``parameters.binary_data_size``
says how many it has (such inputs carry no ``data``). Outputs are asked for in binary with
``outputs[i].parameters.binary_data`` or the request-level ``parameters.binary_data_output``; the answer
then has the same layout, each binary output naming its ``binary_data_size``.

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


HEADER_LENGTH = "Inference-Header-Content-Length"
MODEL_VERSIONS = ("1",)  # every served model has the one version its workers run


class ProtocolError(ValueError):
    """A request that does not follow the v2 protocol; the message says what to fix (HTTP 400)."""


def split_body(raw: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """(JSON header, binary tail) of a request or answer body, per ``Inference-Header-Content-Length``."""
    if header_length is None:
        return raw, b""
    try:
        n = int(header_length)
    except ValueError:
        raise ProtocolError(f"header {HEADER_LENGTH} must be an integer, got {header_length!r}") from None
    if not 0 < n <= len(raw):
        raise ProtocolError(f"header {HEADER_LENGTH} is {n}, but the body has {len(raw)} bytes")
    return raw[:n], raw[n:]


def binary_size(t: Mapping[str, Any]) -> int | None:
    """The ``binary_data_size`` of a validated tensor, or None when it carries JSON ``data``."""
    params = t.get("parameters")
    if isinstance(params, dict) and "binary_data_size" in params:
        return int(params["binary_data_size"])
    return None


def _input_binary_size(i: int, t: Any, names: set[str]) -> int:
    """Check one input tensor of a request (its name not among ``names``, added to them) and return the
    bytes it carries as binary data (0 for a JSON ``data`` tensor)."""
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
    if not isinstance(dt, str) or dt not in DATATYPES:  # a list or object here is unhashable
        raise ProtocolError(f"input {name!r}: unknown datatype {dt!r}; use one of {sorted(DATATYPES)}")
    params = t.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise ProtocolError(f"input {name!r}: 'parameters' must be an object")
    if params and "binary_data_size" in params:
        size = params["binary_data_size"]
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ProtocolError(f"input {name!r}: binary_data_size must be an integer >= 0, got {size!r}")
        if "data" in t:
            raise ProtocolError(f"input {name!r} has both 'data' and binary_data_size; send one")
        return size
    if "data" not in t:
        raise ProtocolError(f"input {name!r} has no 'data' (and no binary_data_size)")
    return 0


def validate_request(body: Any, binary_len: int = 0) -> list[dict[str, Any]]:
    """Check the structure of a v2 inference request and return its ``inputs``.

    Cheap (no tensor decoding), so the gateway can refuse malformed requests before queueing them.
    ``binary_len`` is the number of bytes after the JSON header (binary tensor data extension); the
    inputs' ``binary_data_size`` must account for exactly those bytes.
    """
    if not isinstance(body, dict):
        raise ProtocolError("inference request must be a JSON object with an 'inputs' list")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ProtocolError("inference request needs a non-empty 'inputs' list")
    names: set[str] = set()
    binary = sum(_input_binary_size(i, t, names) for i, t in enumerate(inputs))
    if binary != binary_len:
        raise ProtocolError(
            f"the inputs' binary_data_size add up to {binary} bytes, but {binary_len} binary bytes follow "
            f"the JSON header ({HEADER_LENGTH})"
        )
    outputs = body.get("outputs")
    if outputs is not None and (
        not isinstance(outputs, list)
        or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs)
    ):
        raise ProtocolError("'outputs' must be a list of objects with a 'name'")
    return inputs


def rows(inputs: Sequence[Mapping[str, Any]]) -> int:
    """The batch dimension shared by all inputs of one request (their first dimension)."""
    sizes = {int(t["shape"][0]) for t in inputs}
    if len(sizes) != 1:
        raise ProtocolError(f"all inputs of a request must share their first (batch) dimension, got {sizes}")
    return sizes.pop()


def decode_tensor(t: Mapping[str, Any], blob: bytes | None = None) -> np.ndarray:
    """A validated v2 input tensor as a numpy array of its shape and datatype; ``blob`` holds its raw
    little-endian bytes when it came as binary data."""
    name, shape, dtype = t["name"], [int(d) for d in t["shape"]], DATATYPES[t["datatype"]]
    if blob is not None:
        need = math.prod(shape) * dtype.itemsize
        if len(blob) != need:
            raise ProtocolError(
                f"input {name!r}: shape {shape} of {t['datatype']} needs {need} bytes, got {len(blob)}"
            )
        return np.frombuffer(blob, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False).reshape(shape)
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


REASON_BAD_REQUEST = "bad-request"


def error_body(message: str, reason: str = REASON_BAD_REQUEST, **extra: Any) -> dict[str, Any]:
    """A v2 error object; ``reason`` is a machine-readable cause (e.g. a scheduler drop reason)."""
    return {"error": message, "reason": reason, **extra}


def error_json(message: str, reason: str = REASON_BAD_REQUEST, **extra: Any) -> bytes:
    """:func:`error_body` written by the JSON encoder (never by string formatting)."""
    return dumps(error_body(message, reason, **extra))


def binary_outputs(body: Mapping[str, Any], names: Sequence[str]) -> tuple[list[str], set[str]]:
    """The outputs a request asks for (all of ``names`` when it names none) and which go back binary."""
    params = body.get("parameters")
    default = bool(params.get("binary_data_output", False)) if isinstance(params, dict) else False
    asked = body.get("outputs")
    if not asked:
        return list(names), set(names) if default else set()
    chosen: list[str] = []
    binary: set[str] = set()
    for o in asked:
        name = o["name"]
        if name not in names:
            raise ProtocolError(f"unknown output {name!r}; the model has {sorted(names)}")
        chosen.append(name)
        p = o.get("parameters")
        if bool(p["binary_data"]) if isinstance(p, dict) and "binary_data" in p else default:
            binary.add(name)
    return chosen, binary


def tensor_bytes(arr: np.ndarray) -> bytes:
    """Raw little-endian row-major bytes of an array (binary tensor data extension)."""
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
