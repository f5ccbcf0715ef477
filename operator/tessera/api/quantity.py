"""Pod quantities of Tessera's extended resources, read the way the API server returns them.

The API server keeps quantities in canonical form, so a component reads what the server wrote, not what
the user did: `8000` comes back as `8k`, `16384Mi` as `16Gi`. Every component reads `tessera.io/gpu`,
`tessera.io/gpu-memory` and `tessera.io/gpu-compute` through `resource_quantity`, so all agree:

- `tessera.io/gpu-memory` is MiB per GPU. A plain or decimal-suffixed quantity counts MiB (`8000` = `8k` =
  8000 MiB); a binary suffix (Ki, Mi, Gi, Ti, Pi, Ei) makes it bytes, converted to MiB (`16Gi` = 16384 MiB,
  `512Mi` = 512 MiB).
- `tessera.io/gpu` (GPUs spanned) and `tessera.io/gpu-compute` (percent of one GPU's SMs) are plain counts;
  a binary suffix (bytes) is refused.
- Each must come to a whole number in its unit, at least 1 and at most a bound far past any real GPU (so
  `1e999` is refused with a reason instead of overflowing). Anything else raises QuantityError.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from kubernetes.utils.quantity import parse_quantity

from tessera.api import contract

MIB: Final = 1 << 20
BINARY_SUFFIXES: Final = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


class QuantityError(ValueError):
    """A resource quantity that does not say a usable amount, with the resource, the value and why."""


@dataclass(frozen=True, slots=True)
class _Unit:
    name: str  # what one unit is, for messages
    maximum: int
    bytes_suffix: bool  # a binary suffix means bytes (converted to this unit) rather than being refused
    when_left_out: str  # what leaving the resource out means, for the message on 0


UNITS: Final = {
    contract.RESOURCE_GPU: _Unit("GPUs", 1024, False, "a pod without GPUs asks for no tessera.io resource"),
    # 16 TiB per GPU: far past any GPU built, small enough for every counter that sums it.
    contract.RESOURCE_GPU_MEMORY: _Unit("MiB", 1 << 24, True, "left out, it defaults to the whole GPU"),
    contract.RESOURCE_GPU_COMPUTE: _Unit(
        "percent", 100, False, "left out, it defaults to the pod's share of the GPU's memory"
    ),
}


def resource_quantity(resource: str, value: object) -> int:
    """`value` of `resource` (one of UNITS) as a whole number of its unit; QuantityError when unusable."""
    unit = UNITS[resource]
    what = f"{resource} {value!r}"
    if isinstance(value, bool) or not isinstance(value, str | int | float | Decimal):
        raise QuantityError(f"{what} is not a Kubernetes quantity")
    try:
        parsed = parse_quantity(value)  # type: ignore[no-untyped-call]  # the client ships no annotations
    except ValueError:
        raise QuantityError(f"{what} is not a Kubernetes quantity (e.g. 8000, 8k, 16Gi)") from None
    if not isinstance(parsed, Decimal) or not parsed.is_finite():
        raise QuantityError(f"{what} is not a finite Kubernetes quantity")
    if isinstance(value, str) and value.strip().endswith(BINARY_SUFFIXES):
        if not unit.bytes_suffix:
            raise QuantityError(f"{what}: a binary suffix means bytes; {resource} counts {unit.name}")
        amount = parsed / MIB
    else:
        amount = parsed
    if amount < 0:
        raise QuantityError(f"{what} is negative")
    if amount > unit.maximum:  # before int(): 1e999 would be a thousand-digit integer
        raise QuantityError(f"{what} is more than {unit.maximum} {unit.name}, the most Tessera accepts")
    if amount != amount.to_integral_value():
        raise QuantityError(
            f"{what} is {amount.normalize():f} {unit.name}, not a whole number of {unit.name}"
        )
    if amount == 0:
        raise QuantityError(f"{what} must be at least 1 ({unit.when_left_out})")
    return int(amount)


def pod_totals(spec: Mapping[str, Any]) -> dict[str, int] | None:
    """Each of Tessera's resources summed over a pod spec's containers (a container's limit, else its
    request: the API server defaults an extended resource's request from its limit); None when no container
    names any of them. QuantityError for a value `resource_quantity` refuses."""
    totals = dict.fromkeys(UNITS, 0)
    seen = False
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        merged = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        for name in totals:
            if name in merged:
                seen = True
                totals[name] += resource_quantity(name, merged[name])
    return totals if seen else None
