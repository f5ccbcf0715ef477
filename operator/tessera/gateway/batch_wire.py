"""The gateway ↔ worker batch exchange, built so neither side re-encodes what it does not need to read.

Request: ``POST {worker}/v2/models/{name}/batch`` with ``{"solo": bool, "requests": [<v2 body>, ...]}``,
written by splicing the clients' raw request bodies into the array — the gateway never re-encodes a
tensor. Members that brought binary tensor data (``Inference-Header-Content-Length``) have their bytes
appended after that JSON, member after member, and the batch request carries the header too. Answer,
when the request carries ``x-tessera-framing: members``: the members' fragments back to back, each the
JSON of that member's ``outputs`` list (status 200) followed by the raw bytes of its binary outputs, or
the JSON of its error object (status 4xx); ``x-tessera-members`` lists ``status:json_length:binary_length``
per member, and the timings travel in headers
(``x-tessera-compute-seconds``, ``x-tessera-queue-seconds``, ``x-tessera-solo-seconds`` with ``-`` for a
member that did not run). The gateway slices each member's outputs into its answer unparsed. Without
the header the worker answers one JSON object (``results``, ``compute_seconds``, ...) for other clients.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp

from tessera.gateway.protocol import HEADER_LENGTH

FRAMING_HEADER = "x-tessera-framing"
FRAMING_MEMBERS = "members"
MEMBERS_HEADER = "x-tessera-members"
COMPUTE_HEADER = "x-tessera-compute-seconds"
QUEUE_HEADER = "x-tessera-queue-seconds"
SOLO_HEADER = "x-tessera-solo-seconds"


# A worker accepts batch bodies up to this size; the gateway accepts client bodies up to
# CLIENT_MAX_BODY and splits a joined batch so that it stays below WORKER_MAX_BODY, so any request the
# gateway took fits a worker on its own, with room for the batch envelope.
CLIENT_MAX_BODY = 64 * 1024 * 1024
WORKER_MAX_BODY = CLIENT_MAX_BODY + 1024 * 1024
ENVELOPE_BYTES = 64


class WorkerFailure(RuntimeError):
    """The worker did not run the batch (transport error, non-200 answer or a malformed answer)."""


class BatchTooLarge(RuntimeError):
    """The worker refused the batch body as too large (413): a fault of the batch's size, not of the
    worker; the gateway splits the batch and tries again."""


@dataclass(frozen=True)
class WorkerAnswer:
    members: list[tuple[int, bytes, bytes]]  # (status, JSON fragment, binary bytes) per member, in order
    compute_seconds: float
    queue_seconds: float
    solo_seconds: list[float | None] | None


def batch_request(
    bodies: Sequence[bytes], solo: bool, blobs: Sequence[bytes] = ()
) -> tuple[bytes, int | None]:
    """The batch body around already-validated v2 request bodies (each a JSON object), and the length
    of its JSON part when binary tensor bytes follow it (``None`` when none do)."""
    head = b'{"solo":' + (b"true" if solo else b"false") + b',"requests":[' + b",".join(bodies) + b"]}"
    tail = b"".join(blobs)
    return (head + tail, len(head)) if tail else (head, None)


def batch_size_bytes(body: bytes, blob: bytes) -> int:
    """What one member adds to a batch body."""
    return len(body) + len(blob) + 1


def frame_members(fragments: Sequence[tuple[int, bytes, bytes]]) -> tuple[bytes, str]:
    """Body and ``x-tessera-members`` header value for the members' fragments."""
    body = b"".join(j + b for _, j, b in fragments)
    return body, ",".join(f"{s}:{len(j)}:{len(b)}" for s, j, b in fragments)


def _seconds(value: str | None, name: str) -> float:
    try:
        return float(value) if value is not None else 0.0
    except ValueError:
        raise WorkerFailure(f"worker sent {name}: {value!r}, not a number of seconds") from None


def read_framed(body: bytes, headers: Mapping[str, str], expected: int) -> WorkerAnswer:
    """Split a framed answer into its members; any inconsistency is a :class:`WorkerFailure`."""
    spec = headers.get(MEMBERS_HEADER)
    if spec is None:
        raise WorkerFailure(f"worker answer has no {MEMBERS_HEADER} header; is it a tessera worker?")
    members: list[tuple[int, bytes, bytes]] = []
    at = 0
    try:
        for item in spec.split(",") if spec else []:
            status, length, binary = (int(x) for x in item.split(":"))
            members.append((status, body[at : at + length], body[at + length : at + length + binary]))
            at += length + binary
    except ValueError:
        raise WorkerFailure(f"malformed {MEMBERS_HEADER} header {spec[:200]!r}") from None
    if len(members) != expected or at != len(body):
        raise WorkerFailure(
            f"worker answered {len(members)} members in {len(body)} bytes for {expected} requests "
            f"(framing covers {at} bytes)"
        )
    solo_raw = headers.get(SOLO_HEADER)
    solo: list[float | None] | None = None
    if solo_raw is not None:
        solo = [None if x == "-" else _seconds(x, SOLO_HEADER) for x in solo_raw.split(",")]
    return WorkerAnswer(
        members,
        _seconds(headers.get(COMPUTE_HEADER), COMPUTE_HEADER),
        _seconds(headers.get(QUEUE_HEADER), QUEUE_HEADER),
        solo,
    )


async def post_batch(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    bodies: Sequence[bytes],
    *,
    solo: bool,
    timeout_s: float,
    blobs: Sequence[bytes] = (),
) -> WorkerAnswer:
    """Run ``bodies`` (with their binary bytes ``blobs``) as one batch on the worker at ``url``; raises
    :class:`BatchTooLarge` on a 413, :class:`WorkerFailure` or ``aiohttp.ClientError`` / ``TimeoutError``
    when it could not run it."""
    data, header_length = batch_request(bodies, solo, blobs)
    headers = {"Content-Type": "application/json", FRAMING_HEADER: FRAMING_MEMBERS}
    if header_length is not None:
        headers[HEADER_LENGTH] = str(header_length)
    async with session.post(
        f"{url}/v2/models/{model}/batch",
        data=data,
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
    ) as resp:
        body = await resp.read()
        if resp.status == 413:
            raise BatchTooLarge(f"worker refused a {len(data)}-byte batch of {len(bodies)} as too large")
        if resp.status != 200:
            raise WorkerFailure(f"HTTP {resp.status}: {body[:200].decode(errors='replace')}")
        return read_framed(body, resp.headers, len(bodies))
