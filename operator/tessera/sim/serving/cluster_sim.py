"""Multi-GPU serving simulation for Symphony and its baselines (Symphony §5).

Static models with latency profiles ℓ(b) = αb + β and per-model SLOs; requests arrive per model (Poisson
or Gamma with a CV, equal popularity as in Symphony §3.4); a :class:`~tessera.policy.serving.common.
ClusterScheduler` matches them to GPUs. Execution is deterministic at ℓ(b), as Symphony emulated GPUs by
sleeping ℓ(b) (Symphony §5). Every request ends in exactly one outcome: on time, late, or dropped.

Also here: the goodput search (highest offered rate whose bad rate stays within a bound, the paper's
binary search, Symphony §3.4), the minimum-GPU search for a fixed load, and an autoscaling loop driven by
:func:`~tessera.policy.serving.symphony.autoscale_advice` (A.8).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tessera.policy.serving.baselines.cluster import ClockworkClusterScheduler, ShepherdScheduler
from tessera.policy.serving.common import Batch, ClusterScheduler, LinearProfile, Request
from tessera.policy.serving.symphony import SymphonyScheduler, autoscale_advice
from tessera.sim.serving.arrivals import gamma_arrivals

# What a serving scenario's cluster section runs when it names no policies (the variants are opt-in).
CLUSTER_DEFAULT_POLICIES = ("symphony", "eager", "eager-headgreedy", "shepherd", "clockwork")
CLUSTER_POLICIES = (
    "symphony",
    "symphony-clustergpus",
    "symphony-headgreedy",
    "eager",
    "eager-headgreedy",
    "shepherd",
    "clockwork",
)


@dataclass(frozen=True)
class ServedModel:
    """A static model: latency profile (seconds) and its SLO (seconds)."""

    name: str
    profile: LinearProfile
    slo: float

    def __post_init__(self) -> None:
        if not self.slo > self.profile(1):
            raise ValueError(
                f"model {self.name}: SLO {self.slo} s must exceed the batch-1 latency {self.profile(1)} s"
            )


def identical_models(
    n: int, *, alpha: float, beta: float, slo: float, max_batch: int = 512
) -> list[ServedModel]:
    """``n`` copies of one profile (the Fig. 6a case study uses 10 of α = 1 ms and β = 1-15 ms)."""
    prof = LinearProfile(alpha, beta, max_batch)
    return [ServedModel(f"m{i}", prof, slo) for i in range(n)]


def make_scheduler(
    policy: str,
    models: Sequence[ServedModel],
    n_gpus: int,
    *,
    timeout: float | None = None,
    get_batch: str = "headGreedy",
    target_batch: str = "modelRate",
) -> ClusterScheduler:
    """``symphony`` (deferred, Alg. 1, GETBATCH ``get_batch``), ``eager`` (Alg. 1 with line 5 changed to
    dispatch at once, k = 0, and everything else Symphony's: the same ``get_batch`` and drop policy, as
    Symphony §3.4 defines it), ``eager-headgreedy`` (k = 0 with the head-greedy GETBATCH whatever
    ``get_batch`` says: what ``eager`` was before, kept as a named variant), ``timeout`` (k = ``timeout``,
    same ``get_batch``), ``shepherd`` or ``clockwork`` (A.11). ``target_batch`` is the early-drop GETBATCH's
    target rule (``modelRate``, the authors' code's, or ``clusterGpus``; see :class:`SymphonyScheduler`);
    ``symphony-clustergpus`` is ``symphony`` with ``clusterGpus`` whatever ``target_batch`` says, and
    ``symphony-headgreedy`` is ``symphony`` with the head-greedy GETBATCH whatever ``get_batch`` says (the pairing
    with ``eager-headgreedy`` that changes only line 5)."""
    profiles = {m.name: m.profile for m in models}
    tb = target_batch
    if policy == "symphony":
        return SymphonyScheduler(profiles, n_gpus, get_batch=get_batch, target_batch=tb)
    if policy == "symphony-headgreedy":
        return SymphonyScheduler(profiles, n_gpus, get_batch="headGreedy")
    if policy == "symphony-clustergpus":
        return SymphonyScheduler(profiles, n_gpus, get_batch=get_batch, target_batch="clusterGpus")
    if policy == "eager":
        return SymphonyScheduler(profiles, n_gpus, timeout=0.0, get_batch=get_batch, target_batch=tb)
    if policy == "eager-headgreedy":
        return SymphonyScheduler(profiles, n_gpus, timeout=0.0, get_batch="headGreedy")
    if policy == "timeout":
        if timeout is None or timeout < 0:
            raise ValueError("policy 'timeout' needs a timeout k >= 0 (seconds)")
        return SymphonyScheduler(profiles, n_gpus, timeout=timeout, get_batch=get_batch, target_batch=tb)
    if policy == "shepherd":
        return ShepherdScheduler(profiles, n_gpus)
    if policy == "clockwork":
        return ClockworkClusterScheduler(profiles, n_gpus)
    raise ValueError(f"unknown cluster policy {policy!r}; choose from {[*CLUSTER_POLICIES, 'timeout']}")


def make_cluster_requests(
    models: Sequence[ServedModel],
    total_rate: float,
    duration: float,
    rng: np.random.Generator,
    *,
    cv: float = 1.0,
) -> list[Request]:
    """Equal-popularity arrivals: each model gets ``total_rate / len(models)`` (Gamma with ``cv``)."""
    if not models:
        raise ValueError("need at least one model")
    per = total_rate / len(models)
    rows: list[tuple[float, int]] = []
    for k in range(len(models)):
        rows += [(t, k) for t in gamma_arrivals(per, cv, duration, rng).tolist()]
    rows.sort()
    return [
        Request(i, models[k].name, t, t + models[k].slo, models[k].name, models[k].profile(1))
        for i, (t, k) in enumerate(rows)
    ]


@dataclass
class ClusterStats:
    policy: str
    n_gpus: int
    duration: float
    n: int = 0
    on_time: int = 0
    late: int = 0
    dropped: int = 0
    preempted_batches: int = 0
    busy: list[float] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    # Per model, requests arriving at or after the warm-up (``simulate_cluster(warmup=...)``): how many,
    # and how many finished by their deadline. Drops and late requests are the misses.
    model_requests: dict[str, int] = field(default_factory=dict)
    model_on_time: dict[str, int] = field(default_factory=dict)

    @property
    def goodput(self) -> float:
        return self.on_time / self.duration

    @property
    def bad_rate(self) -> float:
        return 1.0 - self.on_time / self.n if self.n else 0.0

    @property
    def busy_fraction(self) -> float:
        return sum(self.busy) / (self.n_gpus * self.duration)

    @property
    def gpus_used(self) -> int:
        """GPUs busy more than 5 % of the time (the [ref-sim] reading of "GPUs in use", A.7)."""
        return sum(b > 0.05 * self.duration for b in self.busy)

    @property
    def median_batch(self) -> float:
        return float(np.median(self.batch_sizes)) if self.batch_sizes else 0.0

    def latency_percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) if self.latencies else math.nan

    def model_bad_rates(self) -> dict[str, float]:
        """Per model, the share of measured requests that missed their SLO (late or dropped)."""
        return {m: 1.0 - self.model_on_time[m] / n for m, n in self.model_requests.items() if n}


def simulate_cluster(
    policy: str,
    scheduler: ClusterScheduler,
    requests: Sequence[Request],
    models: Sequence[ServedModel],
    n_gpus: int,
    *,
    duration: float,
    warmup: float = 0.0,
) -> ClusterStats:
    """Drive ``scheduler`` with ``requests`` (sorted by arrival) until every timer has fired.

    The aggregate counts cover every request; the per-model counts only those arriving at or after
    ``warmup`` (the cluster starts empty, so the first batches see no queue)."""
    prof = {m.name: m.profile for m in models}
    reqs = sorted(requests, key=lambda r: (r.arrival, r.rid))
    batches: list[Batch] = []
    cancelled: dict[int, float] = {}
    take_cancelled: Callable[[], list[tuple[Batch, float]]] | None = getattr(
        scheduler, "take_cancelled", None
    )
    i = 0
    while True:
        ta = reqs[i].arrival if i < len(reqs) else math.inf
        nt = scheduler.next_timer()
        tt = math.inf if nt is None else nt
        if ta == math.inf and tt == math.inf:
            break
        if tt < ta:
            batches += scheduler.advance(tt)
        else:
            batches += scheduler.advance(ta, strictly_before=True)
            scheduler.enqueue(reqs[i], ta)
            i += 1
            batches += scheduler.advance(ta)
        scheduler.take_drops()  # drops are counted below as requests never served
        if take_cancelled is not None:
            for b, t in take_cancelled():
                cancelled[id(b)] = t
    st = ClusterStats(policy, n_gpus, duration, n=len(reqs), busy=[0.0] * n_gpus)
    served: set[int] = set()
    in_time: set[int] = set()
    for b in batches:
        dur = prof[b.model](b.size)
        if id(b) in cancelled:  # preempted: the time it ran is wasted, its requests were requeued
            st.busy[b.worker] += _within(b.start, cancelled[id(b)], duration)
            st.preempted_batches += 1
            continue
        st.busy[b.worker] += _within(b.start, b.start + dur, duration)
        st.batch_sizes.append(b.size)
        finish = b.start + dur
        for r in b.requests:
            if r.rid in served:
                raise RuntimeError(f"request {r.rid} was served twice by {policy}")
            served.add(r.rid)
            st.latencies.append(finish - r.arrival)
            if finish <= r.deadline + 1e-9:
                st.on_time += 1
                in_time.add(r.rid)
            else:
                st.late += 1
    st.dropped = st.n - len(served)
    for m in models:
        st.model_requests[m.name] = st.model_on_time[m.name] = 0
    for r in reqs:
        if r.arrival >= warmup:
            st.model_requests[r.model] += 1
            st.model_on_time[r.model] += r.rid in in_time
    return st


def _within(start: float, end: float, horizon: float) -> float:
    """Length of [start, end) inside the measured interval [0, horizon)."""
    return max(0.0, min(end, horizon) - min(start, horizon))


def run_policy(
    policy: str,
    models: Sequence[ServedModel],
    n_gpus: int,
    total_rate: float,
    *,
    duration: float,
    seed: int,
    cv: float = 1.0,
    timeout: float | None = None,
    get_batch: str = "headGreedy",
    warmup: float = 0.0,
    target_batch: str = "modelRate",
) -> ClusterStats:
    reqs = make_cluster_requests(models, total_rate, duration, np.random.default_rng(seed), cv=cv)
    sched = make_scheduler(
        policy, models, n_gpus, timeout=timeout, get_batch=get_batch, target_batch=target_batch
    )
    return simulate_cluster(policy, sched, reqs, models, n_gpus, duration=duration, warmup=warmup)


def staggered_batch(model: ServedModel, n_gpus: int) -> int:
    """The largest b with (1 + 1/N)·ℓ(b) ≤ SLO (A.6 Eq. 1), at least 1."""
    b = 1
    while b < model.profile.max_batch and (1 + 1 / n_gpus) * model.profile(b + 1) <= model.slo:
        b += 1
    return b


def staggered_capacity(models: Sequence[ServedModel], n_gpus: int) -> float:
    """Upper bound on the total rate of equally popular ``models`` sharing ``n_gpus`` GPUs (A.6 Eq. 1-2).

    A request of model m costs at least ℓ_m(b_m)/b_m GPU-seconds at its staggered batch b_m, so a total
    rate λ split evenly needs λ·mean_m(ℓ_m(b_m)/b_m) ≤ N. For identical models this is one model's
    N·b/ℓ(b); for a mixed set it lies between the slowest model's N·b/ℓ(b) and that times the model count
    (the slowest model's capacity alone, returned before, is below what the faster models add)."""
    if not models:
        raise ValueError("need at least one model")
    cost = [m.profile(b) / b for m in models for b in (staggered_batch(m, n_gpus),)]
    return n_gpus * len(models) / sum(cost)


def max_goodput(
    policy: str,
    models: Sequence[ServedModel],
    n_gpus: int,
    *,
    duration: float,
    seed: int,
    bad_rate: float = 0.01,
    cv: float = 1.0,
    iters: int = 9,
    timeout: float | None = None,
    get_batch: str = "headGreedy",
    target_batch: str = "modelRate",
) -> float:
    """The highest total rate (req/s) with bad rate ≤ ``bad_rate``, by bisection (Symphony §3.4)."""
    lo, hi = 0.0, 1.2 * staggered_capacity(models, n_gpus)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        st = run_policy(
            policy,
            models,
            n_gpus,
            mid,
            duration=duration,
            seed=seed,
            cv=cv,
            timeout=timeout,
            get_batch=get_batch,
            target_batch=target_batch,
        )
        if st.bad_rate <= bad_rate:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class GoodputProbe:
    """One offered rate of :func:`per_model_goodput`'s search: the worst model's bad rate, pooled over seeds."""

    rate: float
    worst_bad_rate: float
    worst_model: str
    ok: bool


def per_model_goodput(
    policy: str,
    models: Sequence[ServedModel],
    n_gpus: int,
    *,
    measure: float,
    warmup: float,
    seeds: Sequence[int],
    cv: float = 1.0,
    quantile: float = 0.99,
    rel_tol: float = 0.01,
    get_batch: str = "headGreedy",
    timeout: float | None = None,
    probes: list[GoodputProbe] | None = None,
    target_batch: str = "modelRate",
) -> float:
    """Symphony's goodput (§1, §3.4): the highest total rate at which every model's ``quantile`` latency
    meets its own SLO, a dropped request counting as a miss; i.e. at most 1 − ``quantile`` of each model's
    requests are bad.

    Each rate runs ``warmup + measure`` seconds per seed and counts the requests arriving after the
    warm-up, pooled over ``seeds`` (one longer sample per model). The search brackets the rate from
    1.2 × :func:`staggered_capacity` (growing it while it still passes) and bisects until the bracket is
    within ``rel_tol`` of its top; the pass/fail of every probe is appended to ``probes`` if given."""
    if not seeds or measure <= 0 or warmup < 0 or not 0 < quantile < 1:
        raise ValueError("need seeds, measure > 0, warmup >= 0 and 0 < quantile < 1")
    allowed = 1.0 - quantile

    def probe(rate: float) -> bool:
        n: dict[str, int] = {}
        good: dict[str, int] = {}
        for seed in seeds:
            st = run_policy(
                policy, models, n_gpus, rate, duration=warmup + measure, seed=seed, cv=cv,
                timeout=timeout, get_batch=get_batch, warmup=warmup, target_batch=target_batch,
            )  # fmt: skip
            for m, k in st.model_requests.items():
                n[m] = n.get(m, 0) + k
                good[m] = good.get(m, 0) + st.model_on_time[m]
        bad = {m: 1.0 - good[m] / k for m, k in n.items() if k}
        worst = max(bad, key=lambda m: bad[m])
        ok = bad[worst] <= allowed + 1e-12
        if probes is not None:
            probes.append(GoodputProbe(rate, bad[worst], worst, ok))
        return ok

    lo, hi = 0.0, 1.2 * staggered_capacity(models, n_gpus)
    while probe(hi):
        lo, hi = hi, 1.5 * hi
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return lo


def min_gpus(
    policy: str,
    models: Sequence[ServedModel],
    total_rate: float,
    *,
    duration: float,
    seed: int,
    bad_rate: float = 0.01,
    cv: float = 1.0,
    max_gpus: int = 256,
    get_batch: str = "headGreedy",
    target_batch: str = "modelRate",
) -> int | None:
    """The fewest GPUs serving ``total_rate`` with bad rate ≤ ``bad_rate`` (None if ``max_gpus`` fail).

    Bisection assumes more GPUs never hurt, which holds for these schedulers up to simulation noise."""

    def ok(n: int) -> bool:
        st = run_policy(
            policy, models, n, total_rate, duration=duration, seed=seed, cv=cv, get_batch=get_batch,
            target_batch=target_batch,
        )  # fmt: skip
        return st.bad_rate <= bad_rate

    if not ok(max_gpus):
        return None
    lo, hi = 0, max_gpus  # ok(hi) holds; ok(lo) does not (0 GPUs serve nothing)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class AutoscaleStep:
    n_gpus: int
    bad_rate: float
    idle_fraction: float
    advice: int


def autoscale(
    policy: str,
    models: Sequence[ServedModel],
    total_rate: float,
    n_start: int,
    *,
    epochs: int,
    duration: float,
    seed: int,
    bad_threshold: float = 0.01,
    min_gpus_: int = 1,
    cv: float = 1.0,
    release_damping: float = 1.0,
    get_batch: str = "headGreedy",
) -> list[AutoscaleStep]:
    """Run ``epochs`` epochs at a fixed load, applying the A.8 advice after each: add N·r/(1−r) when
    the bad rate r exceeds the threshold, else release N·f for idle fraction f (Symphony §3.5).

    ``release_damping`` < 1 releases only that share of N·f (Tessera's choice): the paper's rule assumes
    a flat top (bad rate ≈ (o−p)/o above peak), and where goodput collapses past peak instead, releasing
    all idle GPUs at once overshoots and the loop oscillates."""
    if not 0 < release_damping <= 1:
        raise ValueError(f"release_damping must be in (0, 1], got {release_damping!r}")
    n, out = n_start, []
    for e in range(epochs):
        st = run_policy(
            policy, models, n, total_rate, duration=duration, seed=seed + e, cv=cv, get_batch=get_batch
        )
        idle = 1.0 - st.busy_fraction
        adv = autoscale_advice(
            n, min(st.bad_rate, 0.999), max(0.0, min(1.0, idle)), bad_threshold=bad_threshold
        )
        if adv < 0:
            adv = -math.floor(-adv * release_damping)
        out.append(AutoscaleStep(n, st.bad_rate, idle, adv))
        n = max(min_gpus_, n + adv)
    return out
