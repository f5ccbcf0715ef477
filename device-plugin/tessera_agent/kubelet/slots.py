"""Virtual device slots: each physical GPU is advertised as N devices `<uuid>::<k>` (as NVIDIA's
k8s-device-plugin does for `replicas`).

The IDs follow NVIDIA's annotated-ID format, so a slot always names its GPU and fits the 63-character limit.
"""

from __future__ import annotations

SEPARATOR = "::"
MAX_ID_LENGTH = 63


def slot_id(uuid: str, k: int) -> str:
    sid = f"{uuid}{SEPARATOR}{k}"
    if len(sid) > MAX_ID_LENGTH:
        raise ValueError(f"device ID {sid!r} exceeds the device plugin limit of {MAX_ID_LENGTH} characters")
    return sid


def slot_ids(uuid: str, count: int) -> list[str]:
    if count < 1:
        raise ValueError(f"slots per GPU must be at least 1, got {count}")
    return [slot_id(uuid, k) for k in range(count)]


def gpu_of(device_id: str) -> str:
    """The GPU UUID a slot ID belongs to."""
    uuid, sep, k = device_id.rpartition(SEPARATOR)
    if not sep or not uuid or not k.isdigit():
        raise ValueError(f"{device_id!r} is not a Tessera slot ID of the form <gpu-uuid>{SEPARATOR}<n>")
    return uuid
