"""Who holds which GPU. The invariant every policy must keep: no GPU is held by two owners."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


class AllocationError(ValueError):
    pass


@dataclass(slots=True)
class Allocation:
    """A mapping GPU id → owner (an app, job or trial id), with its inverse kept in step."""

    _owner: dict[str, str] = field(default_factory=dict)
    _held: dict[str, set[str]] = field(default_factory=dict)

    def owner(self, gpu_id: str) -> str | None:
        return self._owner.get(gpu_id)

    def held(self, owner: str) -> set[str]:
        return set(self._held.get(owner, ()))

    def owners(self) -> list[str]:
        return [o for o, g in self._held.items() if g]

    def busy(self) -> set[str]:
        return set(self._owner)

    def free(self, all_gpus: Iterable[str]) -> list[str]:
        return [g for g in all_gpus if g not in self._owner]

    def grant(self, owner: str, gpus: Iterable[str]) -> None:
        gpus = list(gpus)
        for g in gpus:
            cur = self._owner.get(g)
            if cur is not None and cur != owner:
                raise AllocationError(f"GPU {g} is already held by {cur}; cannot grant it to {owner}")
        for g in gpus:
            self._owner[g] = owner
            self._held.setdefault(owner, set()).add(g)

    def release(self, owner: str, gpus: Iterable[str] | None = None) -> set[str]:
        mine = self._held.get(owner, set())
        drop = set(mine) if gpus is None else set(gpus) & mine
        for g in drop:
            del self._owner[g]
        mine -= drop
        if not mine:
            self._held.pop(owner, None)
        return drop

    def as_dict(self) -> dict[str, list[str]]:
        return {o: sorted(g) for o, g in self._held.items() if g}
