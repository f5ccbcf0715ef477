"""The gateway ↔ worker batch exchange, built so neither side re-encodes what it does not need to read.

Request: ``POST {worker}/v2/models/{name}/batch`` with ``{"solo": bool, "requests": [<v2 body>, ...]}``,
written by splicing the clients' raw request bodies into the array — the gateway never re-encodes a
tensor. Answer, when the request carries ``x-tessera-framing: members``: the members' fragments back to
back, each the JSON of that member's ``outputs`` list (status 200) or of its error object (status 400);
``x-tessera-members`` lists ``status:length`` per member, and the timings travel in headers
(``x-tessera-compute-seconds``, ``x-tessera-queue-seconds``, ``x-tessera-solo-seconds`` with ``-`` for a
member that did not run). The gateway slices each member's outputs into its answer unparsed. Without
the header the worker answers one JSON object (``results``, ``compute_seconds``, ...) for other clients.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp

FRAMING_HEADER = "x-tessera-framing"
FRAMING_MEMBERS = "members"
MEMBERS_HEADER = "x-tessera-members"
COMPUTE_HEADER = "x-tessera-compute-seconds"
QUEUE_HEADER = "x-tessera-queue-seconds"
SOLO_HEADER = "x-tessera-solo-seconds"


class WorkerFailure(RuntimeError):
    """The worker did not run the batch (transport error, non-200 answer or a malformed answer)."""


@dataclass(frozen=True)
class WorkerAnswer:
    members: list[tuple[int, bytes]]  # (status, JSON fragment) per member, in request order
    compute_seconds: float
    queue_seconds: float
    solo_seconds: list[float | None] | None


def batch_request(bodies: Sequence[bytes], solo: bool) -> bytes:
    """The batch body around already-validated v2 request bodies (each a JSON object)."""
    return b'{"solo":' + (b"true" if solo else b"false") + b',"requests":[' + b",".join(bodies) + b"]}"


def frame_members(fragments: Sequence[tuple[int, bytes]]) -> tuple[bytes, str]:
    """Body and ``x-tessera-members`` header value for the members' fragments."""
    return b"".join(f for _, f in fragments), ",".join(f"{s}:{len(f)}" for s, f in fragments)


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
    members: list[tuple[int, bytes]] = []
    at = 0
    try:
        for item in spec.split(",") if spec else []:
            status, length = (int(x) for x in item.split(":"))
            members.append((status, body[at : at + length]))
            at += length
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
) -> WorkerAnswer:
    """Run ``bodies`` as one batch on the worker at ``url``; raises :class:`WorkerFailure` or
    ``aiohttp.ClientError`` / ``TimeoutError`` when it could not."""
    headers = {"Content-Type": "application/json", FRAMING_HEADER: FRAMING_MEMBERS}
    async with session.post(
        f"{url}/v2/models/{model}/batch",
        data=batch_request(bodies, solo),
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
    ) as resp:
        body = await resp.read()
        if resp.status != 200:
            raise WorkerFailure(f"HTTP {resp.status}: {body[:200].decode(errors='replace')}")
        return read_framed(body, resp.headers, len(bodies))
