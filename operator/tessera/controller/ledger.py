"""The arbiter's renewal ledger: leases renewed in rounds whose App status does not say so yet.

Most of a round's grants renew an App's lease on the GPUs it already holds for the same jobs; only the
expiry moves. Rather than patch each such App's status in the round (at 1000 Apps, some 400 status
patches a round), the round writes one ConfigMap (`contract.LEDGER_CONFIGMAP`, in the operator's
namespace) listing every App whose leases run later than its status says, with those leases, before it
touches any pod. The statuses follow between rounds with the age-only refreshes (`Arbiter.refresh_stale`),
within the status staleness bound; an App written since leaves the ledger at its next write.

A restarted operator, or a standby taking over, reads the ledger before its first round and applies it to
the leases it recovers from status: a lease the ledger renewed is held until the ledger's expiry. An entry
applies only to the App it names (same uid) and only to a lease of status with the same job and GPUs and an
earlier expiry, so an entry left over from before (App deleted, lease since lost or moved, status written
since) changes nothing.

Wire form (the ConfigMap's `data[contract.LEDGER_KEY]`, JSON), compact so that 5,000 Apps fit well under
the 1 MiB object limit: {"round": n, "at": epoch seconds, "apps": {"<namespace>/<name>": [uid,
[[job, node, [GPU index, ...], expiry epoch seconds], ...]], ...}}.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.controller.apps import AppRecord, LeaseRec
from tessera.controller.claims import Claim
from tessera.controller.view import gpu_id, split_gpu_id

log = logging.getLogger(__name__)

# The ConfigMap stays below this (the API server refuses objects over 1 MiB): Apps past it have their
# status written in the round instead.
MAX_BYTES = 900_000

Key = tuple[str, str]
# (job, GPU ids) of one lease → its expiry
LeaseKey = tuple[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Entry:
    """One App's renewed leases: its uid and each lease's expiry by (job, GPUs)."""

    uid: str
    leases: dict[LeaseKey, float]

    @staticmethod
    def of(rec: AppRecord) -> Entry:
        return Entry(rec.uid, {(lease.job, lease.gpus): lease.expires for lease in rec.leases})

    def wire(self) -> list[Any]:
        out: list[list[Any]] = []
        for (job, gpus), expires in sorted(self.leases.items()):
            node = split_gpu_id(gpus[0])[0]
            out.append([job, node, [split_gpu_id(g)[1] for g in gpus], expires])
        return [self.uid, out]


@dataclass(slots=True)
class Ledger:
    """What one round wrote (or a starting operator read)."""

    round: int = 0
    at: float = 0.0
    apps: dict[Key, Entry] = field(default_factory=dict)

    # --- wire ----------------------------------------------------------------------------------------

    def to_json(self) -> str:
        apps = {f"{ns}/{name}": e.wire() for (ns, name), e in sorted(self.apps.items())}
        return json.dumps({"round": self.round, "at": self.at, "apps": apps}, separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> Ledger:
        """The ledger in `text`; what does not parse is left out (an entry, or all of it), never raised."""
        try:
            raw = json.loads(text)
            out = Ledger(int(raw.get("round", 0)), float(raw.get("at", 0.0)))
            apps = raw.get("apps") or {}
        except (ValueError, TypeError, AttributeError) as err:
            log.warning("arbiter ledger unreadable, ignored: %s", err)
            return Ledger()
        for key, value in apps.items():
            try:
                ns, _, name = str(key).partition("/")
                uid, leases = value
                out.apps[(ns, name)] = Entry(
                    str(uid),
                    {
                        (str(job), tuple(gpu_id(str(node), int(i)) for i in idx)): float(expires)
                        for job, node, idx, expires in leases
                    },
                )
            except (ValueError, TypeError) as err:
                log.warning("arbiter ledger entry %s unreadable, ignored: %s", key, err)
        return out

    @staticmethod
    def from_configmap(obj: Mapping[str, Any], key: str) -> Ledger:
        return Ledger.from_json(str((obj.get("data") or {}).get(key) or "{}"))

    # --- recovery ------------------------------------------------------------------------------------

    def apply(self, rec: AppRecord) -> bool:
        """Hold each of the App's leases (recovered from status) until the ledger's later expiry for the
        same job and GPUs, if the ledger names this App (same uid). Returns whether any lease moved."""
        entry = self.apps.get(rec.key)
        if entry is None or entry.uid != rec.uid:
            return False
        moved = False
        for i, lease in enumerate(rec.leases):
            until = entry.leases.get((lease.job, lease.gpus))
            if until is not None and until > lease.expires:
                rec.leases[i] = LeaseRec(lease.gpus, lease.job, until, lease.source)
                moved = True
        return moved

    def claim(self, key: Key, claim: Claim) -> Claim:
        """An App's claim (GPUs until the expiry its status says) with the ledger's later expiries."""
        entry = self.apps.get(key)
        if entry is None or entry.uid != claim.uid:
            return claim
        until: dict[str, float] = {}
        for (_, gpus), expires in entry.leases.items():
            for g in gpus:
                until[g] = max(until.get(g, expires), expires)
        return Claim(
            claim.uid,
            tuple((g, t if t is None or g not in until else max(t, until[g])) for g, t in claim.gpus),
        )


def fit(entries: Iterable[tuple[Key, Entry]], limit: int = MAX_BYTES) -> tuple[dict[Key, Entry], list[Key]]:
    """The entries that fit in `limit` bytes of wire form (in the order given), and the keys of the rest."""
    kept: dict[Key, Entry] = {}
    over: list[Key] = []
    size = 64  # the envelope
    for key, entry in entries:
        n = len(key[0]) + len(key[1]) + 8 + len(json.dumps(entry.wire(), separators=(",", ":")))
        if size + n > limit:
            over.append(key)
            continue
        kept[key] = entry
        size += n
    return kept, over
