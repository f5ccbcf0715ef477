"""Team queues around a training policy: each round the GPUs are divided among queues (`divide`), then the
inner policy (Themis; DRF for the KAI-style baseline) shares each queue's GPUs among that queue's apps
exactly as it shares a whole cluster — seeing only the queue's GPUs, so ρ is computed against the queue's
share. Queues whose lending rule is `immediate` give GPUs back before their leases end (`plan_reclaim`).

Inside a queue, apps are served by priority: the queue's GPUs go to the highest priority's demand first
(the inner policy runs among the apps of one priority on what that priority gets), the rest to the lower
ones. With one priority (none set) that is one run of the inner policy, as without priorities. A
non-preemptible app gets back, at each lease end, the GPUs whose lease just ended (it keeps them until it
is done), and nothing takes them before. A queue whose `within_queue` is `LowerPriority` takes GPUs from its
lower-priority apps for its higher-priority ones at once, after its minimum runtime.

Per-model caps (`model_caps`, a Queue's `maxGPUsByModel`): a queue's apps are offered no GPU of a model of
which they hold their cap already, and a leaf queue's maximum in the division is bounded by the GPUs its caps
let it use, so it is not owed (nor reclaimed for) GPUs its apps could not take.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from tessera.cluster import Cluster
from tessera.policy.queues.division import QueueNode, divide_with_reserves, headroom, own_share, quantize
from tessera.policy.queues.reclaim import Holding, Reclaim, ReclaimRule, plan_reclaim
from tessera.policy.training import AppState, Grant, RoundDecision, TrainingPolicy, lease_expiry

DEFAULT_QUEUE = "default"


def with_default(queues: Sequence[QueueNode]) -> list[QueueNode]:
    """The queues plus `default` (no guarantee, weight 1) unless one of that name is given."""
    out = list(queues)
    if all(q.name != DEFAULT_QUEUE for q in out):
        out.append(QueueNode(DEFAULT_QUEUE))
    return out


def entitled(capacity: int, queues: Sequence[QueueNode], demand: Mapping[str, float]) -> dict[str, float]:
    """Whole GPUs each queue's own apps are entitled to now."""
    return entitled_and_reserved(capacity, queues, demand)[0]


_RESERVE = "\0reserve:"  # prefix of the reserves' keys when they are rounded with the shares


def entitled_and_reserved(
    capacity: int, queues: Sequence[QueueNode], demand: Mapping[str, float]
) -> tuple[dict[str, float], dict[str, float]]:
    """Whole GPUs each queue's own apps are entitled to now, and whole GPUs held back idle for each queue's
    reserve (`lending_limit`), rounded together so that both fit the capacity."""
    d = divide_with_reserves(capacity, queues, demand)
    own = own_share(queues, d.shares)
    both = {**own, **{_RESERVE + k: v for k, v in d.reserved.items()}}
    rounded = quantize(both, 1.0, capacity, caps={q.name: q.max for q in queues})
    return (
        {k: v for k, v in rounded.items() if not k.startswith(_RESERVE)},
        {k.removeprefix(_RESERVE): v for k, v in rounded.items() if k.startswith(_RESERVE)},
    )


class QueuedPolicy:
    """A `TrainingPolicy` that divides the cluster among team queues, then runs `inner` inside each."""

    def __init__(
        self,
        inner: TrainingPolicy,
        queues: Sequence[QueueNode],
        rules: Mapping[str, ReclaimRule] | None = None,
        name: str | None = None,
        outside: Mapping[str, float] | None = None,
        outside_waiting: Mapping[str, float] | None = None,
        outside_holdings: Sequence[Holding] = (),
        explain: bool = False,
        model_caps: Mapping[str, Mapping[str, int]] | None = None,
    ) -> None:
        self.inner = inner
        self.queues = self._given = with_default(queues)
        # queue → GPU model → the most GPUs of that model its apps may hold (a Queue's maxGPUsByModel).
        self.model_caps = {q: dict(c) for q, c in (model_caps or {}).items() if c}
        self.rules = dict(rules or {})
        # GPUs each queue's other objects hold, which this policy does not move (TrialGroup pools, serving
        # replicas): they count towards the queue's demand and holding, so its apps get only the rest.
        self.outside = dict(outside or {})
        # GPUs those objects wait for within their queue's share: demand like an app's, reclaimed for like
        # an app's, and kept free for them (the queue's apps do not take them; other queues do not borrow
        # them) until the objects take them.
        self.outside_waiting = {q: float(int(n)) for q, n in (outside_waiting or {}).items() if n >= 1}
        # The same GPUs object by object (owner ids that are not apps'), when their owners can give GPUs
        # back (the operator's TrialGroups and ModelDeployments): reclaim may then take from them, and
        # what it takes is listed in `decision.record["outside_reclaims"]` for the owners to act on.
        # Without them, what a queue holds outside is never taken.
        self.outside_holdings = list(outside_holdings)
        # Also plan the reclaims that need no action now (apps' lease-end ones) and record the whole plan,
        # with the queues whose reclaim waits for a minimum runtime: what the operator's Queue status says.
        self.explain = explain
        self.name: str = name or str(getattr(inner, "name", "queued"))
        # The simulator runs rounds with no GPU free only for a policy that may take GPUs back.
        self.preempts = any(
            r.mode == "immediate" or r.within_queue == "LowerPriority" for r in self.rules.values()
        )

    @property
    def lease_s(self) -> float:
        return self.inner.lease_s

    def reclaim_due(self, apps: Iterable[tuple[str, float, float]], n_free: int) -> bool:
        """A round cannot wait for the next tick: a queue with work waiting holds less than its guarantee
        (capped by its demand) while GPUs are free or a queue lending under `immediate` holds more than its
        own. `immediate` promises the GPUs back after the checkpoint grace, not after the grace plus a round
        gap. Which GPUs move, and whether the minimum runtime allows it, the round decides. `apps` gives
        each app's queue name, GPUs held and GPUs wanted."""
        eps = 1e-9
        held = {q: float(int(n)) for q, n in self.outside.items()}
        demand = dict(held)
        for q, n in self.outside_waiting.items():
            demand[q] = demand.get(q, 0.0) + n
        for name, has, wants in apps:
            q = self.queue_of_name(name)
            held[q] = held.get(q, 0.0) + has
            demand[q] = demand.get(q, 0.0) + wants
        owed = any(
            held.get(q.name, 0.0) < min(q.guaranteed, demand.get(q.name, 0.0)) - eps for q in self.queues
        )
        if not owed:
            return False
        if n_free > 0:
            return True
        return any(
            self.rules.get(q.name, ReclaimRule()).mode == "immediate"
            and held.get(q.name, 0.0) > q.guaranteed + eps
            for q in self.queues
        )

    def protected_until(self, now: float, apps: Iterable[tuple[str, int, int, float, bool]]) -> float:
        """The earliest moment after `now` a holding that its queue's minimum runtime protects may be taken
        at once (`immediate` reclaim, or `within_queue` LowerPriority), while some app waits for GPUs;
        math.inf if none. A round is due then: no lease need end, nor any app arrive, for the GPUs to move.
        `apps` gives each app's queue name, GPUs held, GPUs wanted beyond them, holding start and whether
        it is preemptible."""
        rows = list(apps)
        if not any(unmet > 0 for _, _, unmet, _, _ in rows) and not self.outside_waiting:
            return math.inf
        at = math.inf
        for name, has, _, since, preemptible in rows:
            rule = self.rules.get(self.queue_of_name(name), ReclaimRule())
            if has <= 0 or not preemptible or rule.min_runtime_s <= 0:
                continue
            if rule.mode == "immediate" or rule.within_queue == "LowerPriority":
                t = since + rule.min_runtime_s
                if t > now + 1e-9:
                    at = min(at, t)
        return at

    def queue_of(self, app: AppState) -> str:
        return self.queue_of_name(app.queue)

    def queue_of_name(self, name: str) -> str:
        return name if any(q.name == name for q in self.queues) else DEFAULT_QUEUE

    def allocate(
        self,
        now: float,
        apps: Sequence[AppState],
        cluster: Cluster,
        free: Sequence[str],
        rng: random.Random,
    ) -> RoundDecision:
        self.queues = self._within_model_caps(cluster)
        members: dict[str, list[AppState]] = {q.name: [] for q in self.queues}
        for a in apps:
            members[self.queue_of(a)].append(a)
        extra = {q: int(self.outside.get(q, 0.0)) for q in members}
        waits = {q: int(self.outside_waiting.get(q, 0.0)) for q in members}
        demand = {q: float(sum(a.demand_max for a in m) + extra[q] + waits[q]) for q, m in members.items()}
        held = {q: sum(len(a.held) for a in m) + extra[q] for q, m in members.items()}
        share, reserve = entitled_and_reserved(len(cluster), self.queues, demand)
        decision = RoundDecision()
        free = self._renew_pinned(now, apps, free, decision, held)
        renewed = {a.app_id: len(_grants_of(decision, a.app_id)) for a in apps if not a.preemptible}
        blocked: dict[str, float] = {}
        revoke, plan = self._reclaim(now, apps, members, share, held, demand, len(free), renewed, blocked)
        outside_ids = {h.owner for h in self.outside_holdings}
        within = self._within_queue(now, members, share, held, len(free), revoke, renewed)
        for app_id, gpus in within.items():
            revoke[app_id] = (*revoke.get(app_id, ()), *gpus)
        avail = [*free, *(g for gpus in revoke.values() for g in gpus)]
        decision.revoke = revoke
        for a in apps:  # the inner policy sees each app without what it just lost
            if a.app_id in revoke:
                lost = set(revoke[a.app_id])
                a2 = dataclasses.replace(a, held=a.held - lost)
                members[self.queue_of(a)] = [
                    a2 if x.app_id == a.app_id else x for x in members[self.queue_of(a)]
                ]
                held[self.queue_of(a)] -= len(lost)
        # The part of each queue's share its other objects wait for stays free for them, and so do the
        # GPUs its lending limit holds back while it does not use them (`reserve`, outside every share).
        keep = {q: max(0, min(waits[q], int(share[q]) - held[q])) for q in members}
        reserved = int(sum(reserve.values()))
        # First pass: each queue's share; second: GPUs a queue's policy left unused go to queues with
        # unmet demand below their maximum (work-conserving), all but those kept.
        # Both passes stay within every ancestor's maximum (`headroom`): a sibling holding above its share
        # until its lease ends keeps the subtree's room, so a queue's share alone could take the subtree
        # past its parent's maximum (the work-conserving pass did, with no maximum of its own).
        order = sorted(members, key=lambda q: (held[q] - share[q], q))
        # Inside a queue, each priority (highest first) is offered what the ones above it left.
        for q in order:
            for tier in _tiers(members[q]):
                want = min(int(share[q]) - held[q] - keep[q], _whole(headroom(self.queues, held)[q]))
                if want > 0:
                    avail = self._run(now, q, members[q], tier, want, cluster, avail, rng, decision, held)
        cap = {n.name: n.max for n in self.queues}
        for q in order:
            for tier in _tiers(members[q]):
                room = min(
                    cap[q] - held[q],
                    headroom(self.queues, held)[q],
                    sum(a.unmet for a in tier) - _granted(decision, tier),
                )
                spare = len(avail) - sum(keep.values()) - reserved
                if spare >= 1 and room >= 1:
                    avail = self._run(
                        now, q, members[q], tier, int(min(room, spare)), cluster, avail, rng, decision, held
                    )
        decision.record = {
            "queues": {
                q: {"share": share[q], "held": held[q], "reserved": reserve.get(q, 0.0)} for q in members
            },
            "outside_reclaims": [r for r in plan if r.owner in outside_ids],
            "reclaims": plan,
            "reclaim_blocked": blocked,
            "within_queue": sorted(within),
        }
        return decision

    def _within_model_caps(self, cluster: Cluster) -> list[QueueNode]:
        """The queues with each capped leaf queue's maximum bounded by the GPUs of the cluster its per-model
        caps leave it (a parent's caps bound its own apps only, not its children's)."""
        if not self.model_caps:
            return self._given
        parents = {q.parent for q in self._given}
        models = Counter(g.model for g in cluster.gpus)
        out = []
        for q in self._given:
            caps = self.model_caps.get(q.name)
            if caps and q.name not in parents:
                usable = sum(min(n, caps.get(m, n)) for m, n in models.items())
                q = dataclasses.replace(q, max=min(q.max, float(usable)))
            out.append(q)
        return out

    def _renew_pinned(
        self,
        now: float,
        apps: Sequence[AppState],
        free: Sequence[str],
        decision: RoundDecision,
        held: dict[str, int],
    ) -> list[str]:
        """A non-preemptible app gets back the GPUs whose lease just ended (up to its demand), before any
        queue is served: once running it keeps them until it is done. Returns the GPUs still free."""
        left = set(free)
        for a in sorted(apps, key=lambda x: x.app_id):
            if a.preemptible or not a.previous:
                continue
            back = sorted(g for g in a.previous if g in left)[: max(0, a.demand_max - len(a.held))]
            if back:
                decision.grants.append(
                    Grant(a.app_id, tuple(back), lease_expiry(now, self.lease_s), "auction")
                )
                left -= set(back)
                held[self.queue_of(a)] += len(back)
        return [g for g in free if g in left]

    def _within_queue(
        self,
        now: float,
        members: Mapping[str, list[AppState]],
        share: Mapping[str, float],
        held: Mapping[str, int],
        n_free: int,
        revoked: Mapping[str, tuple[str, ...]],
        renewed: Mapping[str, int],
    ) -> dict[str, tuple[str, ...]]:
        """GPUs taken now from lower-priority apps of a queue whose `within_queue` is `LowerPriority`, for
        its higher-priority apps that the queue's GPUs do not cover: the queue's GPUs (its share, or what
        it holds if more) go down the priorities, and a priority holding more than what is left for it
        gives back the difference. Free GPUs within the share are used first; preemptible holdings only,
        past the queue's minimum runtime, the lowest priority and the newest holding first."""
        out: dict[str, tuple[str, ...]] = {}
        for q, apps in members.items():
            rule = self.rules.get(q, ReclaimRule())
            tiers = _tiers(apps)
            if rule.within_queue != "LowerPriority" or len(tiers) < 2:
                continue
            have = {
                a.app_id: len(a.held) + renewed.get(a.app_id, 0) - len(revoked.get(a.app_id, ()))
                for a in apps
            }
            budget = max(int(share.get(q, 0.0)), held[q])
            room = min(n_free, max(0, int(share.get(q, 0.0)) - held[q]))
            victims = sorted(
                (
                    a
                    for a in apps
                    if a.preemptible and have[a.app_id] > 0 and now - a.since >= rule.min_runtime_s - 1e-9
                ),
                key=lambda a: (a.priority, -a.since, a.app_id),
            )
            for tier in tiers:
                target = min(sum(a.demand_max for a in tier), budget)
                budget -= target
                short = target - sum(have[a.app_id] for a in tier)
                use = min(room, max(0, short))
                room -= use
                short -= use
                for v in victims:
                    if short <= 0:
                        break
                    if v.priority >= tier[0].priority or have[v.app_id] <= 0:
                        continue
                    n = min(short, have[v.app_id])
                    gone = {*revoked.get(v.app_id, ()), *out.get(v.app_id, ())}
                    kept = [g for g in sorted(v.held) if g not in gone]
                    out[v.app_id] = (*out.get(v.app_id, ()), *kept[-n:])
                    have[v.app_id] -= n
                    short -= n
        return out

    def _run(
        self,
        now: float,
        q: str,
        queue_apps: list[AppState],
        apps: list[AppState],
        want: int,
        cluster: Cluster,
        avail: list[str],
        rng: random.Random,
        decision: RoundDecision,
        held: dict[str, int],
    ) -> list[str]:
        """Offer `want` of the available GPUs (next to the queue's own first) to the inner policy on the
        queue's part of the cluster, for `apps` (the queue's apps of one priority); returns what is still
        available."""
        mine = {g for a in queue_apps for g in a.held} | {
            g for gr in decision.grants if gr.app_id in {a.app_id for a in queue_apps} for g in gr.gpus
        }
        nodes = {cluster.gpu(g).node for g in mine}
        ranked = sorted(avail, key=lambda g: (cluster.gpu(g).node not in nodes, cluster.order(g)))
        offer = self._capped(q, ranked, mine, want, cluster)
        if not offer:
            return avail
        granted_before = {a.app_id: len(a.held) for a in apps}
        for gr in decision.grants:
            if gr.app_id in granted_before:
                granted_before[gr.app_id] += len(gr.gpus)
        view = [dataclasses.replace(a, held=frozenset(a.held | _grants_of(decision, a.app_id))) for a in apps]
        sub = cluster.subset(mine | set(offer))
        inner = self.inner.allocate(now, view, sub, cluster.sorted(offer), rng)
        taken: set[str] = set()
        for g in inner.grants:
            decision.grants.append(g)
            taken |= set(g.gpus)
            held[q] += len(g.gpus)
        return [g for g in avail if g not in taken]

    def _capped(self, q: str, ranked: list[str], mine: set[str], want: int, cluster: Cluster) -> list[str]:
        """The first `want` of `ranked`, passing over GPUs of a model of which the queue's apps hold (with
        `mine`) their cap already."""
        caps = self.model_caps.get(q)
        if not caps:
            return ranked[:want]
        have = Counter(cluster.gpu(g).model for g in mine)
        out: list[str] = []
        for g in ranked:
            if len(out) >= want:
                break
            m = cluster.gpu(g).model
            if m in caps and have[m] >= caps[m]:
                continue
            have[m] += 1
            out.append(g)
        return out

    def _reclaim(
        self,
        now: float,
        apps: Sequence[AppState],
        members: Mapping[str, list[AppState]],
        share: Mapping[str, float],
        held: Mapping[str, int],
        demand: Mapping[str, float],
        n_free: int,
        renewed: Mapping[str, int],
        blocked: dict[str, float],
    ) -> tuple[dict[str, tuple[str, ...]], list[Reclaim]]:
        """GPUs taken now from apps of queues lending under `immediate` (lease-end reclaim needs no action
        here: a lease that ends frees its GPUs and the next division hands them to the queue owed them),
        and the reclaim plan, in which other objects' owners find what to give back (either mode: they act
        on it themselves)."""
        if not self.preempts and not self.outside_holdings and not self.explain:
            return {}, []
        holdings = [
            Holding(
                self.queue_of(a),
                a.app_id,
                float(len(a.held) + renewed.get(a.app_id, 0)),
                a.since,
                math.inf,
                a.priority,
                a.preemptible,
            )
            for a in apps
            if a.held or renewed.get(a.app_id, 0)
        ]
        holdings += [
            dataclasses.replace(h, queue=self.queue_of_name(h.queue))
            for h in self.outside_holdings
            if h.gpus > 0
        ]
        # What other objects hold without owners listed counts for their queue but is never taken (held
        # "since forever").
        listed = {self.queue_of_name(h.queue) for h in self.outside_holdings}
        holdings += [
            Holding(q, f"outside/{q}", float(n), math.inf, math.inf)
            for q, n in self.outside.items()
            if n > 0 and q not in listed
        ]
        waiting = {q: max(0.0, demand[q] - held[q]) for q in members}
        top = {q: max((a.priority for a in m if a.unmet > 0), default=0) for q, m in members.items()}
        plan = plan_reclaim(
            now, self.queues, self.rules, share, holdings, waiting, float(n_free), top, blocked=blocked
        )
        by_id = {a.app_id: a for a in apps}
        out: dict[str, list[str]] = {}
        for r in plan:
            if r.owner not in by_id or r.mode != "immediate":
                continue
            a = by_id[r.owner]
            left = [g for g in sorted(a.held) if g not in out.get(r.owner, [])]
            out.setdefault(r.owner, []).extend(left[-math.ceil(r.gpus - 1e-9) :])
        return {k: tuple(v) for k, v in out.items() if v}, plan


def _whole(gpus: float) -> int:
    """Whole GPUs within `gpus` (a large number for no bound)."""
    return math.floor(gpus + 1e-9) if math.isfinite(gpus) else 1 << 62


def _tiers(apps: Sequence[AppState]) -> list[list[AppState]]:
    """The apps grouped by priority, highest first (one group when none is set)."""
    by: dict[int, list[AppState]] = {}
    for a in apps:
        by.setdefault(a.priority, []).append(a)
    return [by[p] for p in sorted(by, reverse=True)]


def _grants_of(decision: RoundDecision, app_id: str) -> frozenset[str]:
    return frozenset(g for gr in decision.grants if gr.app_id == app_id for g in gr.gpus)


def _granted(decision: RoundDecision, apps: Sequence[AppState]) -> int:
    ids = {a.app_id for a in apps}
    return sum(len(g.gpus) for g in decision.grants if g.app_id in ids)


__all__ = ["DEFAULT_QUEUE", "Grant", "QueuedPolicy", "entitled", "entitled_and_reserved", "with_default"]
