"""One served model at the gateway: its request queue, the policy object that forms batches, the workers
that run them, and the bookkeeping that gives every request exactly one answer.

The batch scheduler is the ``tessera.policy.serving`` object built from the model's config; this module
only drives it (``enqueue`` / ``next_batch`` / ``on_complete`` / ``take_drops`` / ``next_wakeup``, or
``enqueue`` / ``advance`` / ``next_timer`` for Symphony) with the event loop's monotonic clock, exactly as
the simulator (``tessera.sim.serving.worker_sim``) does with simulated time.

Every request ends in one :class:`Outcome`:

* 200 with the outputs (on time or late — a late answer still counts as an SLO miss);
* 503/504 with a JSON ``reason`` when the scheduler drops it (its :class:`DropReason`; ``expired`` is 504);
* 503 ``worker-failed`` when its worker failed and no retry could save it (a failed batch's requests are
  re-queued up to ``max_retries`` times while their deadline is ahead);
* 504 ``expired`` from the sweeper when it is still queued ``late_grace_s`` after its deadline, so no
  request waits forever even if a policy holds on to it;
* the model's own 4xx (e.g. a tensor of the wrong shape) for that request alone: counted as
  ``rejected``, neither a drop nor a worker failure, and the rest of its batch is served.

A joined batch whose body would exceed what a worker accepts is sent in parts (one after another on the
same worker); a 413 from a worker halves the part and lowers that worker's limit, and a lone request a
worker still refuses gets the 413 itself. A worker counts as ready only while it answers its health
check (every ``health_interval_s``, busy or not), so readiness follows the workers.

Request bodies are kept as the bytes the client sent and spliced into the worker's batch request; the
worker's framed answer is sliced back into per-member outputs (:mod:`tessera.gateway.batch_wire`), so no
tensor is decoded or re-encoded here.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tessera.gateway.batch_wire import (
    ENVELOPE_BYTES,
    WORKER_MAX_BODY,
    BatchTooLarge,
    WorkerAnswer,
    WorkerFailure,
    batch_size_bytes,
    post_batch,
)
from tessera.gateway.config import ModelConfig, build_scheduler
from tessera.gateway.extensions import InferStats, model_config
from tessera.gateway.metrics import OUTCOME_DROPPED, OUTCOME_MET, OUTCOME_MISSED, ModelMetrics
from tessera.gateway.profiler import CapturedRequest, OnlineProfiler
from tessera.gateway.protocol import dumps, error_json, loads
from tessera.policy.serving.common import Batch, BatchTimings, Drop, DropReason, LinearProfile, Request
from tessera.policy.serving.symphony import SymphonyScheduler
from tessera.policy.serving.symphony.colocation import InflationTracker, colocated_profile

log = logging.getLogger(__name__)

REASON_WORKER_FAILED = "worker-failed"
REASON_NO_WORKER = "no-healthy-worker"
REASON_SHUTDOWN = "shutting-down"
REASON_INTERNAL = "internal-error"
REASON_TOO_LARGE = "too-large"
OUTCOME_REJECTED = "rejected"  # the model refused the request's input: the caller's fault, not a drop
# Consecutive failed health checks that take a worker out: a refused connection counts at once, a
# timeout (a loaded machine) only when it repeats.
TIMEOUTS_TO_UNHEALTHY = 2

_DROP_TEXT = {
    DropReason.CANNOT_MEET_DEADLINE: "no batch the scheduler can form would finish it by its deadline",
    DropReason.EXPIRED: "its deadline passed while it was queued",
    DropReason.EARLY_DROP: "dropped early so the planned batch could meet its deadline",
    DropReason.ACTION_REJECTED: "its planned batch could not start within its window",
    DropReason.EXCESS: "beyond the batch its worker was assigned",
}


@dataclass(frozen=True)
class Outcome:
    """The answer to one request: HTTP status, body (JSON, then binary output bytes when
    ``header_length`` says where the JSON ends), and for a 200 whether it met its SLO."""

    status: int
    body: bytes
    slo_met: bool | None = None
    header_length: int | None = None


@dataclass
class Pending:
    request: Request
    body: bytes  # the client's v2 request (its JSON part), validated, as received
    future: asyncio.Future[Outcome]
    client_id: str | None = None
    retries: int = 0
    running: bool = False
    blob: bytes = b""  # binary tensor bytes that followed the JSON
    rows: int = 1  # its batch dimension (the first dimension of its inputs)
    # perf_counter stamps: arrival at the gateway, batch formed, hand-off to the worker, answer back.
    arrived: float = 0.0
    queued: float = 0.0
    formed: float = 0.0
    handoff: float = 0.0
    back: float = 0.0

    @property
    def wire_size(self) -> int:
        return batch_size_bytes(self.body, self.blob)


@dataclass
class WorkerSlot:
    index: int
    url: str
    healthy: bool = False
    busy: bool = False
    fifo: deque[Batch] = field(default_factory=deque)  # Symphony assigns batches ahead of time
    metadata: dict[str, Any] | None = None
    max_body: int = WORKER_MAX_BODY  # lowered when the worker answers 413
    timeouts: int = 0  # consecutive health checks that timed out


class ModelService:
    """Queue, scheduler and workers of one model (see the module docstring)."""

    def __init__(
        self,
        cfg: ModelConfig,
        session: aiohttp.ClientSession,
        *,
        metrics: ModelMetrics | None = None,
        rng: random.Random | None = None,
        rid_source: Callable[[], int] | None = None,
    ) -> None:
        self.cfg = cfg
        self.session = session
        self.metrics = metrics
        self.scheduler = build_scheduler(cfg)
        self.symphony = isinstance(self.scheduler, SymphonyScheduler)
        self.inflation = _inflation_tracker(cfg) if self.symphony else None
        self.slots = [WorkerSlot(i, url) for i, url in enumerate(cfg.workers)]
        p = cfg.profiler_options
        self.profiler = OnlineProfiler(p.sample_rate, p.max_share, p.max_pending, rng or random.Random(0))
        self.pending: dict[int, Pending] = {}
        self._next_rid = rid_source or itertools.count().__next__
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._bg: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self.batches = 0
        self.retried = 0
        # Counters since start for the operator's stats reader (GET /stats): answers by outcome, and the
        # seconds workers spent computing this model's batches and profiling runs, as they report them.
        self.outcomes: dict[str, int] = dict.fromkeys(
            (OUTCOME_MET, OUTCOME_MISSED, OUTCOME_DROPPED, OUTCOME_REJECTED), 0
        )
        self.busy_seconds = 0.0
        # The same answers in the terms of Triton's statistics extension (tessera.gateway.extensions).
        self.infer_stats = InferStats()

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self, health_interval: float) -> None:
        self._loop = asyncio.get_running_loop()
        await asyncio.gather(*(self._check(s) for s in self.slots))
        self._bg = [
            asyncio.create_task(self._health_loop(health_interval)),
            asyncio.create_task(self._sweep_loop()),
        ]

    async def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        for t in [*self._bg, *self._tasks]:
            t.cancel()
        for t in [*self._bg, *self._tasks]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for p in list(self.pending.values()):
            self._fail(p, 503, REASON_SHUTDOWN, "the gateway is shutting down")

    @property
    def ready(self) -> bool:
        return any(s.healthy for s in self.slots)

    @property
    def queued(self) -> int:
        return sum(1 for p in self.pending.values() if not p.running)

    def metadata(self) -> dict[str, Any]:
        meta = next((s.metadata for s in self.slots if s.metadata is not None), None)
        out: dict[str, Any] = {"name": self.cfg.name, "versions": ["1"], "platform": "tessera-gateway"}
        if meta is not None:
            out["inputs"], out["outputs"] = meta.get("inputs", []), meta.get("outputs", [])
        return out

    def model_config(self) -> dict[str, Any]:
        """The model's configuration in Triton's terms (tessera.gateway.extensions)."""
        cfg = self.cfg
        chooses = cfg.policy in ("orloj", "clockwork")  # they pick among batch_sizes
        return model_config(
            cfg.name,
            self.metadata(),
            max_batch=max(cfg.batch_sizes, default=cfg.max_batch) if chooses else cfg.max_batch,
            preferred_batch_sizes=sorted(cfg.batch_sizes) if chooses else (),
            max_queue_delay_s=cfg.timeout.max_queue_delay_s if cfg.policy == "timeout" else 0.0,
            instances=len(self.slots),
            parameters={
                "tessera.policy": cfg.policy,
                "tessera.slo_seconds": f"{cfg.slo_s:g}",
                "tessera.namespace": cfg.namespace,
            },
        )

    def stats(self) -> dict[str, Any]:
        """Counters since start (never reset): answers by outcome and the workers' busy seconds."""
        return {
            "namespace": self.cfg.namespace,
            "slo_s": self.cfg.slo_s,
            "workers": len(self.slots),
            "healthy_workers": sum(1 for s in self.slots if s.healthy),
            "requests": dict(self.outcomes),
            "busy_seconds": self.busy_seconds,
            **({"colocation_inflation": self.inflation.current} if self.inflation is not None else {}),
        }

    def _now(self) -> float:
        assert self._loop is not None, "ModelService.start() was not called"
        return self._loop.time()

    # -- requests --------------------------------------------------------------------------------
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
        """Queue one validated v2 request (its raw JSON ``body`` and the binary tensor bytes ``blob``
        after it, ``rows`` its batch dimension) and wait for its single answer. ``arrived`` is the
        ``perf_counter`` time it reached the gateway (for the overhead figures in the answer)."""
        if self.closed:
            return Outcome(503, _err("the gateway is shutting down", REASON_SHUTDOWN))
        now = self._now()
        slo = self.cfg.slo_s if budget is None else budget
        req = Request(self._next_rid(), self.cfg.name, now, now + slo, app)
        fut: asyncio.Future[Outcome] = self._loop.create_future()  # type: ignore[union-attr]
        queued = time.perf_counter()
        self.pending[req.rid] = Pending(
            req,
            body,
            fut,
            client_id,
            blob=blob,
            arrived=queued if arrived is None else arrived,
            queued=queued,
            rows=rows,
        )
        self.scheduler.enqueue(req, now)
        self._pump()
        return await fut

    def _resolve(self, p: Pending, out: Outcome, outcome: str, latency: float | None) -> None:
        if p.future.done():
            return
        p.future.set_result(out)
        self.pending.pop(p.request.rid, None)
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        done = time.perf_counter()
        if outcome in (OUTCOME_MET, OUTCOME_MISSED):
            self.infer_stats.succeeded(
                p.rows,
                total=done - p.arrived,
                queue=p.formed - p.queued,
                compute_input=p.handoff - p.formed,
                compute_infer=p.back - p.handoff,
                output=done - p.back,
            )
        else:
            self.infer_stats.failed(done - p.arrived)
        if self.metrics is not None:
            self.metrics.finished(outcome, latency)
            self.metrics.queue_length(self.queued)

    def _fail(self, p: Pending, status: int, reason: str, message: str) -> None:
        self._resolve(p, Outcome(status, _err(message, reason, p.retries)), OUTCOME_DROPPED, None)

    def _handle_drops(self, drops: list[Drop]) -> None:
        for d in drops:
            p = self.pending.get(d.request.rid)
            if p is None:
                continue
            status = 504 if d.reason is DropReason.EXPIRED else 503
            text = _DROP_TEXT.get(d.reason, d.reason.value)
            self._fail(
                p, status, d.reason.value, f"request dropped by the {self.cfg.policy} scheduler: {text}"
            )

    # -- batch formation ---------------------------------------------------------------------------
    def _pump(self) -> None:
        """Let the scheduler fill idle workers now; arm a timer for its next wake-up."""
        if self.closed:
            return
        now = self._now()
        if isinstance(self.scheduler, SymphonyScheduler):
            for b in self.scheduler.advance(now):
                self._assign(b)
            self._handle_drops(self.scheduler.take_drops())
            for s in self.slots:
                if not s.busy and s.fifo:
                    self._start(s, s.fifo.popleft())
            wake = self.scheduler.next_timer()
        else:
            sched = self.scheduler
            advance = getattr(sched, "advance", None)
            if advance is not None:  # planners that act while workers are busy (Clockwork)
                advance(now)
            for s in self.slots:
                if not s.healthy or s.busy:
                    continue
                batch = sched.next_batch(now, s.index)
                self._handle_drops(sched.take_drops())
                if batch is None:
                    break
                self._start(s, batch)
            self._handle_drops(sched.take_drops())
            wake = sched.next_wakeup(now)
        self._arm(wake, now)
        if self.metrics is not None:
            self.metrics.queue_length(self.queued)

    def _arm(self, wake: float | None, now: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if wake is None:
            return
        if wake <= now:  # due already: only useful if a worker is free to take what it releases
            if not any(s.healthy and not s.busy for s in self.slots):
                return
            wake = now + 0.001
        assert self._loop is not None
        self._timer = self._loop.call_at(wake, self._pump)

    def _assign(self, b: Batch) -> None:
        """Symphony names the GPU; if that worker is down, the least-loaded healthy one runs it."""
        slot = self.slots[b.worker] if 0 <= b.worker < len(self.slots) else None
        if slot is None or not slot.healthy:
            healthy = [s for s in self.slots if s.healthy]
            if not healthy:
                for r in b.requests:
                    if (p := self.pending.get(r.rid)) is not None:
                        self._fail(p, 503, REASON_NO_WORKER, f"no healthy worker for model {self.cfg.name}")
                return
            slot = min(healthy, key=lambda s: (s.busy + len(s.fifo), s.index))
        slot.fifo.append(b)

    def _start(self, slot: WorkerSlot, batch: Batch) -> None:
        live = [
            p for r in batch.requests if (p := self.pending.get(r.rid)) is not None and not p.future.done()
        ]
        if not live:
            return
        slot.busy = True
        formed = time.perf_counter()
        for p in live:
            p.running = True
            p.formed = formed
        self.batches += 1
        if self.metrics is not None:
            self.metrics.batch(len(live))
        self._spawn(self._run(slot, batch, live))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, slot: WorkerSlot, members: list[Pending], solo: bool) -> WorkerAnswer:
        return await post_batch(
            self.session,
            slot.url,
            self.cfg.name,
            [p.body for p in members],
            blobs=[p.blob for p in members],
            solo=solo,
            timeout_s=self.cfg.worker_timeout_s,
        )

    def _parts(self, members: list[Pending], limit: int) -> list[list[Pending]]:
        """Consecutive parts of a batch whose bodies each fit ``limit`` bytes (a request too large on
        its own is a part by itself, for the worker to refuse)."""
        parts: list[list[Pending]] = [[]]
        size = ENVELOPE_BYTES
        for p in members:
            if parts[-1] and size + p.wire_size > limit:
                parts.append([])
                size = ENVELOPE_BYTES
            parts[-1].append(p)
            size += p.wire_size
        return parts

    async def _post_fitting(
        self,
        slot: WorkerSlot,
        members: list[Pending],
        done: list[tuple[Pending, int, bytes, bytes]],
        ran: list[tuple[int, float, float]],
    ) -> float:
        """Run ``members`` on ``slot`` in as many parts as its body limit needs, appending (member,
        status, JSON, binary) to ``done`` for each member that ran or was refused as its part returns,
        and (rows, hand-off, back) to ``ran`` for each part the worker ran; the compute seconds of all
        parts."""
        todo = self._parts(members, slot.max_body)
        compute = 0.0
        while todo:
            part = todo.pop(0)
            handoff = time.perf_counter()
            for p in part:
                p.handoff = handoff
            try:
                data = await self._post(slot, part, solo=False)
            except BatchTooLarge:
                size = ENVELOPE_BYTES + sum(p.wire_size for p in part)
                slot.max_body = max(1, min(slot.max_body, size - 1))
                if len(part) == 1:
                    msg = f"the request ({size} bytes) is larger than worker {slot.url} accepts"
                    done.append((part[0], 413, error_json(msg, REASON_TOO_LARGE), b""))
                    continue
                half = len(part) // 2
                todo[:0] = [part[:half], part[half:]]
                continue
            back = time.perf_counter()
            compute += data.compute_seconds
            ran.append((sum(p.rows for p in part), handoff, back))
            for p, (status, fragment, blob) in zip(part, data.members, strict=True):
                p.back = back
                done.append((p, status, fragment, blob))
        return compute

    async def _run(self, slot: WorkerSlot, batch: Batch, live: list[Pending]) -> None:
        answers: list[tuple[Pending, int, bytes, bytes]] = []
        parts: list[tuple[int, float, float]] = []
        try:
            compute = await self._post_fitting(slot, live, answers, parts)
        except (aiohttp.ClientError, TimeoutError, WorkerFailure, ValueError) as err:
            now = self._now()  # parts answered before the failure keep their answers
            for p, status, fragment, blob in answers:
                self._answer(p, status, fragment, blob, now, len(live), slot.index)
            self._executed(parts, live[0].formed)
            self._worker_failed(slot, [p for p in live if not p.future.done()], err)
            return
        except Exception as err:  # a bug here must still answer every member
            log.exception("batch on %s failed unexpectedly", slot.url)
            for p in live:
                self._fail(p, 500, REASON_INTERNAL, f"gateway error while running the batch: {err}")
            slot.busy = False
            self._pump()
            return
        now = self._now()
        self.busy_seconds += compute
        for p, status, fragment, blob in answers:
            self._answer(p, status, fragment, blob, now, len(live), slot.index)
        self._executed(parts, live[0].formed)
        if not isinstance(self.scheduler, SymphonyScheduler):
            self.scheduler.on_complete(batch, BatchTimings(now - compute, now, {}), now)
        elif self.inflation is not None and answers:
            self._observe_inflation(len(live), compute, now)
        ran = [p for p, status, _, _ in answers if status == 200]
        self.profiler.offer([CapturedRequest(p.request, p.body, p.blob) for p in ran], compute)
        slot.busy = False
        self._pump()
        if not slot.busy and slot.healthy:
            self._maybe_profile(slot)

    def _executed(self, ran: list[tuple[int, float, float]], formed: float) -> None:
        """Count the parts a worker ran (rows, hand-off, back) once their members are answered: each
        part's input time runs from the end of the one before it (the batch's forming, for the first)."""
        answered = time.perf_counter()
        start = formed
        for rows, handoff, back in ran:
            self.infer_stats.executed(rows, handoff - start, back - handoff, answered - back)
            start = back

    def _observe_inflation(self, batch_size: int, compute: float, now: float) -> None:
        """Plan with ℓ(b) times the observed inflation once it moves (BE lanes on the workers' GPUs)."""
        assert self.inflation is not None and isinstance(self.scheduler, SymphonyScheduler)
        before = self.inflation.current
        new = self.inflation.observe(batch_size, compute)
        if new is None:
            return
        self.scheduler.set_profile(self.cfg.name, colocated_profile(self.inflation.dedicated, new), now)
        log.info(
            "%s: batches take %.2fx the dedicated profile (was %.2fx); re-planned", self.cfg.name, new, before
        )

    def _answer(
        self, p: Pending, status: int, fragment: bytes, blob: bytes, now: float, batch_size: int, worker: int
    ) -> None:
        """Wrap the worker's outputs fragment (JSON list, passed through unparsed) and binary output
        bytes into a v2 answer; a member the model refused gets its own 4xx."""
        r = p.request
        if status != 200:
            try:
                err = loads(fragment)
                msg, reason = err.get("error"), err.get("reason")
            except (ValueError, AttributeError):
                msg, reason = None, None
            code = status if 400 <= status < 500 else 400
            body = _err(str(msg or "the worker could not run this request"), str(reason or "bad-request"))
            self._resolve(p, Outcome(code, body), OUTCOME_REJECTED, None)
            return
        latency = now - r.arrival
        on_time = now <= r.deadline
        head: dict[str, Any] = {"model_name": self.cfg.name, "model_version": "1"}
        if p.client_id is not None:
            head["id"] = p.client_id
        params = {
            "tessera_latency_seconds": latency,
            "tessera_slo_met": on_time,
            "tessera_batch_size": batch_size,
            "tessera_retries": p.retries,
            "tessera_worker": worker,
            # Where the time went at the gateway: queued for the scheduler, at the worker (round trip),
            # and the gateway's own work — arrival to hand-off less the queueing, and back to answer.
            "tessera_queue_seconds": p.formed - p.queued,
            "tessera_worker_seconds": p.back - p.handoff,
            "tessera_overhead_seconds": 0.0,
        }
        head_json = dumps(head)[:-1] + b',"outputs":' + fragment + b',"parameters":'
        params["tessera_overhead_seconds"] = _overhead(p)  # last, to cover building this answer
        body = head_json + dumps(params) + b"}"
        out = Outcome(200, body + blob, on_time, len(body) if blob else None)
        self._resolve(p, out, OUTCOME_MET if on_time else OUTCOME_MISSED, latency)

    def _worker_failed(self, slot: WorkerSlot, live: list[Pending], err: BaseException) -> None:
        log.warning("worker %s failed a batch of %d: %s", slot.url, len(live), err or type(err).__name__)
        slot.healthy, slot.busy = False, False
        now = self._now()
        for p in live:
            if p.future.done():
                continue
            if p.retries < self.cfg.max_retries and now < p.request.deadline:
                p.retries += 1
                p.running = False
                self.retried += 1
                self.scheduler.enqueue(p.request, now)
            else:
                self._fail(
                    p,
                    503,
                    REASON_WORKER_FAILED,
                    f"worker {slot.url} failed while running this request "
                    f"({type(err).__name__}: {err}); retries used: {p.retries}",
                )
        orphans = list(slot.fifo)
        slot.fifo.clear()
        for b in orphans:
            self._assign(b)
        self._pump()

    def _maybe_profile(self, slot: WorkerSlot) -> None:
        samples = self.profiler.take(4)
        if not samples:
            return
        slot.busy = True
        self._spawn(self._profile(slot, samples))

    async def _profile(self, slot: WorkerSlot, samples: list[CapturedRequest]) -> None:
        """Re-run sampled requests alone and feed their solo times to the scheduler."""
        start = self._now()
        data: WorkerAnswer | None
        probes = [
            Pending(s.request, s.body, self._loop.create_future(), blob=s.blob)  # type: ignore[union-attr]
            for s in samples
        ]
        try:
            data = await self._post(slot, probes, solo=True)
        except (aiohttp.ClientError, TimeoutError, WorkerFailure, BatchTooLarge, ValueError) as err:
            log.info("profiling on %s failed: %s", slot.url, err)
            slot.healthy = False
            data = None
        finally:
            slot.busy = False
        if data is not None:
            solo = data.solo_seconds or []
            times = {s.request.rid: float(t) for s, t in zip(samples, solo, strict=False) if t is not None}
            now = self._now()
            self.busy_seconds += data.compute_seconds
            self.profiler.record(sum(times.values()), len(times))
            if times and not isinstance(self.scheduler, SymphonyScheduler):
                reqs = [s.request for s in samples if s.request.rid in times]
                self.scheduler.on_complete(
                    Batch(reqs, slot.index, start, 0.0, self.cfg.name), BatchTimings(start, now, times), now
                )
        self._pump()

    # -- background --------------------------------------------------------------------------------
    async def _check(self, slot: WorkerSlot) -> None:
        """One health check: the worker must say its model is ready (and, when newly ready, describe it)."""
        timeout = aiohttp.ClientTimeout(total=1.0)
        base = f"{slot.url}/v2/models/{self.cfg.name}"
        timed_out = False
        try:
            async with self.session.get(f"{base}/ready", timeout=timeout) as resp:
                ok = resp.status == 200
            if ok and (slot.metadata is None or not slot.healthy):
                async with self.session.get(base, timeout=timeout) as resp:
                    ok = resp.status == 200
                    if ok:
                        slot.metadata = await resp.json()
        except TimeoutError:
            ok, timed_out = False, True
        except (aiohttp.ClientError, ValueError):
            ok = False
        slot.timeouts = slot.timeouts + 1 if timed_out else 0
        if ok and not slot.healthy:
            log.info("worker %s for %s is ready", slot.url, self.cfg.name)
            slot.healthy = True
            if self._loop is not None and self._bg:
                self._pump()
        elif not ok and slot.healthy and (not timed_out or slot.timeouts >= TIMEOUTS_TO_UNHEALTHY):
            log.warning("worker %s for %s failed its health check", slot.url, self.cfg.name)
            slot.healthy = False

    async def _health_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await asyncio.gather(*(self._check(s) for s in self.slots))

    async def _sweep_loop(self) -> None:
        grace = self.cfg.grace
        period = min(0.05, max(grace / 4, 0.005))
        while True:
            await asyncio.sleep(period)
            now = self._now()
            for p in list(self.pending.values()):
                if not p.running and now > p.request.deadline + grace:
                    self._fail(
                        p,
                        504,
                        DropReason.EXPIRED.value,
                        f"still queued {grace:.3f}s after its deadline; no worker could take it in time",
                    )


def _inflation_tracker(cfg: ModelConfig) -> InflationTracker | None:
    s = cfg.symphony
    if s is None or not s.observe_inflation:
        return None
    return InflationTracker(
        LinearProfile(s.alpha, s.beta, max_batch=cfg.max_batch),
        start=s.colocation_inflation,
        window=s.inflation_window,
        min_samples=s.inflation_min_samples,
        band=s.inflation_band,
    )


def _err(message: str, reason: str, retries: int = 0) -> bytes:
    """An error answer; ``retries`` says how often a worker failure re-queued the request first."""
    return error_json(message, reason, retries=retries)


def _overhead(p: Pending) -> float:
    """The gateway's own time on a request: arrival to hand-off less the time it waited in the queue
    for the scheduler, plus answer back to now (the answer is built)."""
    return (p.queued - p.arrived) + (p.handoff - p.formed) + (time.perf_counter() - p.back)
