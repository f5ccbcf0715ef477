"""The AlpaServe router of a serving pool (AlpaServe §4.3; §3.1, §5.3).

Every request of a pool model comes here. Among the groups holding the model it picks the one with the
shortest queue — the earliest predicted drain time of its last stage, the measure the planner's
simulator uses (``tessera.policy.serving.alpaserve.dispatch``), ties to the lowest group — and replays the
group's FCFS pipeline with the profiled stage latencies: if the request would finish after its deadline
even so, it is refused at once (503 ``cannot-meet-slo``, counted as dropped: against attainment) and the
group's clocks stay as they were; otherwise the clocks advance and the request goes to the group's
worker, which runs its groups' requests first come, first served (stage by stage for a pipeline).
No batching (paper §1.1 scope). The prediction is corrected by what is measured: a group whose answer
drains (no request in flight) has its clocks set to that moment, so a prediction that ran ahead of or
behind the worker does not carry over into the next burst.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tessera.api.contract import HEADER_APP
from tessera.gateway.config import PoolConfig, PoolGroupConfig
from tessera.gateway.extensions import InferStats, model_config
from tessera.gateway.metrics import OUTCOME_DROPPED, OUTCOME_MET, OUTCOME_MISSED, ModelMetrics
from tessera.gateway.protocol import HEADER_LENGTH, error_json
from tessera.gateway.service import OUTCOME_REJECTED, Outcome
from tessera.policy.serving.alpaserve.dispatch import advance

log = logging.getLogger(__name__)

REASON_CANNOT_MEET_SLO = "cannot-meet-slo"
REASON_NO_REPLICA = "no-replica"
REASON_WORKER_FAILED = "worker-failed"


@dataclass
class _Group:
    id: str
    url: str
    stages: dict[str, tuple[float, ...]]
    clock: tuple[float, ...]
    inflight: int = 0
    healthy: bool = False


@dataclass(frozen=True)
class PoolModelCfg:
    """What the HTTP front reads of a served model (the fields it shares with ``ModelConfig``)."""

    name: str
    namespace: str
    slo_s: float
    default_app: str = "default"
    app_header: str = HEADER_APP


@dataclass
class PoolRouter:
    cfg: PoolConfig
    session: aiohttp.ClientSession
    groups: list[_Group] = field(default_factory=list)
    draining: list[_Group] = field(default_factory=list)  # out of routing, requests still in flight
    routed: dict[str, dict[str, int]] = field(default_factory=dict)  # model → group id → requests sent

    def __post_init__(self) -> None:
        self.groups = [self._group(g) for g in self.cfg.groups]
        self.routed = {m.name: {} for m in self.cfg.models}

    @staticmethod
    def _group(g: PoolGroupConfig) -> _Group:
        return _Group(g.id, g.worker, {m: tuple(lat) for m, lat in g.models.items()}, (0.0,) * g.pp)

    def switch(self, cfg: PoolConfig) -> None:
        """Route by a new plan from the next request on (re-placement, spec §5.3): a group kept with the
        same worker and models keeps its clocks and in-flight count; new groups start empty; groups left
        out stop taking requests and drain — what they run is answered, nothing is cut off."""
        if cfg.models != self.cfg.models:
            raise ValueError("a pool switch changes groups only; the served models are fixed at start")
        old = {g.id: g for g in self.groups}
        new: list[_Group] = []
        for gc in cfg.groups:
            fresh = self._group(gc)
            kept = old.pop(gc.id, None)
            if kept is not None and (kept.url, kept.stages) == (fresh.url, fresh.stages):
                new.append(kept)
            else:
                if kept is not None:
                    old[gc.id + "~"] = kept
                new.append(fresh)
        self.draining = [g for g in (*self.draining, *old.values()) if g.inflight > 0]
        self.groups, self.cfg = new, cfg
        log.info(
            "pool %s routes to %s; draining %s", cfg.name, [g.id for g in new], [g.id for g in self.draining]
        )

    def group_stats(self) -> dict[str, dict[str, Any]]:
        """Per group: whether it takes requests and how many are in flight (the operator deletes a
        drained group's worker only once it is out of routing with nothing in flight)."""
        out = {g.id: {"routing": True, "inflight": g.inflight, "healthy": g.healthy} for g in self.groups}
        for g in self.draining:
            out.setdefault(g.id, {"routing": False, "inflight": 0, "healthy": g.healthy})
            out[g.id]["inflight"] += g.inflight
        return out

    def candidates(self, model: str) -> list[_Group]:
        return [g for g in self.groups if model in g.stages]

    def route(self, model: str, now: float, slo: float) -> tuple[_Group | None, float]:
        """(group, predicted finish): finish inf when the shortest queue cannot meet the deadline; group
        None when no group holds the model."""
        cands = [g for g in self.candidates(model) if g.healthy] or self.candidates(model)
        if not cands:
            return None, math.inf
        g = min(cands, key=lambda g: g.clock[-1])  # stable: ties to the lowest group
        clock, done = advance(now, g.clock, g.stages[model], None)
        finish = done + self.cfg.fixed_overhead_s
        if finish - now > slo:
            return g, math.inf
        g.clock = clock
        return g, finish

    async def health_loop(self, interval: float) -> None:
        """Every ``interval``: each routed group's worker answers its readiness check or is passed over
        (while another group of the model is healthy)."""
        while True:
            await asyncio.sleep(interval)
            await asyncio.gather(*(self.check(g) for g in list(self.groups)))

    async def check(self, g: _Group) -> None:
        try:
            async with self.session.get(
                f"{g.url}/v2/health/ready", timeout=aiohttp.ClientTimeout(total=1.0)
            ) as r:
                g.healthy = r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            g.healthy = False


class PoolModelService:
    """One pool model behind the gateway's HTTP/gRPC front (the subset of ``ModelService`` it uses)."""

    def __init__(self, router: PoolRouter, cfg: PoolModelCfg, metrics: ModelMetrics | None = None) -> None:
        self.router = router
        self.cfg = cfg
        self.metrics = metrics
        self.outcomes: dict[str, int] = dict.fromkeys(
            (OUTCOME_MET, OUTCOME_MISSED, OUTCOME_DROPPED, OUTCOME_REJECTED), 0
        )
        self.busy_seconds = 0.0
        self.closed = False
        self.infer_stats = InferStats()  # Triton's statistics extension (tessera.gateway.extensions)

    async def start(self, health_interval: float) -> None:
        await asyncio.gather(*(self.router.check(g) for g in self.router.candidates(self.cfg.name)))

    async def close(self) -> None:
        self.closed = True

    @property
    def ready(self) -> bool:
        return any(g.healthy for g in self.router.candidates(self.cfg.name))

    def metadata(self) -> dict[str, Any]:
        return {"name": self.cfg.name, "versions": ["1"], "platform": "tessera-gateway"}

    def model_config(self) -> dict[str, Any]:
        """The model's configuration in Triton's terms: not batched (AlpaServe serves requests one by
        one), one instance per group holding it."""
        return model_config(
            self.cfg.name,
            self.metadata(),
            max_batch=0,
            instances=len(self.router.candidates(self.cfg.name)),
            parameters={
                "tessera.policy": "alpaserve",
                "tessera.slo_seconds": f"{self.cfg.slo_s:g}",
                "tessera.namespace": self.cfg.namespace,
                "tessera.pool": self.router.cfg.name,
            },
        )

    def stats(self) -> dict[str, Any]:
        cands = self.router.candidates(self.cfg.name)
        return {
            "namespace": self.cfg.namespace,
            "slo_s": self.cfg.slo_s,
            "workers": len(cands),
            "healthy_workers": sum(1 for g in cands if g.healthy),
            "requests": dict(self.outcomes),
            "busy_seconds": self.busy_seconds,
            "pool": self.router.cfg.name,
            "groups": dict(self.router.routed.get(self.cfg.name, {})),
        }

    def _done(self, outcome: str, latency: float | None, *, rows: int = 1, elapsed: float = 0.0) -> None:
        """Count an answer: ``latency`` of a 200 (None otherwise), ``elapsed`` since arrival of an error."""
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if self.metrics is not None:
            self.metrics.finished(outcome, latency)
        if latency is None:
            self.infer_stats.failed(elapsed)
        else:  # no queue at the gateway: the request goes to its group's worker at once
            self.infer_stats.succeeded(rows, latency, 0.0, 0.0, latency, 0.0)
            self.infer_stats.executed(rows, 0.0, latency, 0.0)

    async def infer(
        self,
        body: bytes,
        *,
        app: str,
        budget: float | None,
        client_id: str | None = None,
        blob: bytes = b"",
        arrived: float | None = None,
        rows: int = 1,
    ) -> Outcome:
        loop = asyncio.get_running_loop()
        now = loop.time()
        slo = self.cfg.slo_s if budget is None else budget
        name = self.cfg.name
        g, finish = self.router.route(name, now, slo)
        if g is None:
            self._done(OUTCOME_DROPPED, None)
            return Outcome(
                503, error_json(f"no group of pool {self.router.cfg.name} holds {name}", REASON_NO_REPLICA)
            )
        if not math.isfinite(finish):
            self._done(OUTCOME_DROPPED, None)
            msg = f"group {g.id}'s queue cannot finish it within {slo * 1000:.1f} ms"
            return Outcome(503, error_json(msg, REASON_CANNOT_MEET_SLO))
        routed = self.router.routed.setdefault(name, {})
        routed[g.id] = routed.get(g.id, 0) + 1
        headers = {HEADER_LENGTH: str(len(body))} if blob else {}
        g.inflight += 1
        try:
            async with self.router.session.post(
                f"{g.url}/v2/models/{name}/infer",
                data=body + blob,
                headers={
                    **headers,
                    "Content-Type": "application/octet-stream" if blob else "application/json",
                },
                timeout=aiohttp.ClientTimeout(total=self.router.cfg.worker_timeout_s),
            ) as resp:
                data = await resp.read()
                status, hl = resp.status, resp.headers.get(HEADER_LENGTH)
        except (aiohttp.ClientError, TimeoutError) as err:
            g.healthy = False
            self._done(OUTCOME_DROPPED, None, elapsed=loop.time() - now)
            return Outcome(503, error_json(f"worker of group {g.id} failed: {err}", REASON_WORKER_FAILED))
        finally:
            g.inflight -= 1
            if g.inflight == 0 and g in self.router.draining:
                self.router.draining.remove(g)
        end = loop.time()
        if g.inflight == 0:  # the group drained: its true clocks are now, whatever was predicted
            g.clock = (end,) * len(g.clock)
        if status != 200:
            outcome = OUTCOME_REJECTED if 400 <= status < 500 else OUTCOME_DROPPED
            self._done(outcome, None, elapsed=end - now)
            return Outcome(status, data)
        latency = end - now
        met = latency <= slo
        self._done(OUTCOME_MET if met else OUTCOME_MISSED, latency, rows=rows)
        return Outcome(200, data, met, int(hl) if hl is not None else None)
