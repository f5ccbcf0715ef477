"""kopf's diff-base ("essence") of an object, built without copying what the essence drops.

On every watch event kopf builds the object's essence — the body without `status` and without metadata
other than labels and annotations — to tell a spec change from anything else. Its builder deep-copies the
whole body first and drops the rest afterwards, so each of the operator's own status writes (one per App
whose leases changed in a round: hundreds at once) comes back as a deep copy of that App's status and
managedFields. `LeanDiffBaseStorage` hands kopf's builder only the parts the essence keeps; the essence,
the annotation it is stored in and every comparison stay kopf's own.

kopf then clears handler progress from both essences (the one stored and the one just built) with its
progress storage, which takes a deep copy of the essence for each of its two stores: four copies of each
App's spec per watch event. `LeanProgressStorage` hands them an essence whose copy copies only what they
change (the top level, metadata, status) and shares the rest with the essence it came from, which kopf
discards.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import kopf

# What kopf's builder keeps of metadata (kopf/_cogs/configs/diffbase.py: DiffBaseStorage.build), and
# what it reads to name its annotation (name, namespace; ownerReferences in CollisionEvadingConvention).
_KEPT_METADATA = ("labels", "annotations", "name", "namespace", "ownerReferences")


def essence_source(raw: dict[str, Any], extra_fields: Iterable[Any] | None) -> dict[str, Any]:
    """The body less what an essence drops: `status`, and metadata but labels and annotations (and what
    kopf reads to name its annotation). A handler's `field=` on status or metadata (an extra field) keeps
    that whole stanza."""
    roots = {_root(field) for field in extra_fields or ()}
    out = {k: v for k, v in raw.items() if k not in ("status", "metadata") or k in roots}
    meta = raw.get("metadata")
    if isinstance(meta, dict) and "metadata" not in roots:
        out["metadata"] = {k: meta[k] for k in _KEPT_METADATA if k in meta}
    return out


def _root(field: Any) -> str:
    if isinstance(field, str):
        return field.split(".", 1)[0]
    return str(next(iter(field), ""))  # kopf's field specs may be tuples of path parts


class LeanDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's default diff-base storage (the `last-handled-configuration` annotation), whose essence is
    built from `essence_source` of the body instead of a deep copy of all of it."""

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        extra = list(extra_fields or ())
        lean = kopf.Body(essence_source(dict(body), extra))  # type: ignore[arg-type]
        return super().build(body=lean, extra_fields=extra)


class _SharedSpec(dict[str, Any]):
    """An essence whose deep copy is new down to what kopf's progress storages edit in place (the top
    level, `metadata`, `status`), sharing everything else (the spec) with this one."""

    def __deepcopy__(self, memo: dict[int, Any]) -> _SharedSpec:
        out = _SharedSpec(self)
        if isinstance(out.get("metadata"), dict):
            out["metadata"] = dict(out["metadata"])  # annotations are replaced there, never edited
        if "status" in out:
            out["status"] = copy.deepcopy(out["status"], memo)
        return out


class LeanProgressStorage(kopf.SmartProgressStorage):
    """kopf's default progress storage (annotations, and status for objects from older kopf), whose
    `clear` copies an essence's spec none of the four times kopf's own copies it per watch event."""

    def clear(self, *, essence: kopf.BodyEssence) -> kopf.BodyEssence:
        return super().clear(essence=_SharedSpec(essence))  # type: ignore[arg-type]
