"""kube-scheduler extender over HTTP: filter, prioritize and bind (k8s-interfaces §2).

Wire format is kube-scheduler's exact JSON (PascalCase; `NodeNames` when nodeCacheCapable, else `Nodes`).
Filter and prioritize read the in-memory SchedulerCache; bind re-checks capacity under a per-node asyncio lock,
reserves the GPUs, writes `tessera.io/assignment`, then creates the Binding — so concurrent binds can never
oversubscribe a GPU; the loser gets an `Error` with the reason and the scheduler retries.

Bind trusts only the pod as the API server holds it (the watched view, else a GET), matched by UID: its
request is parsed afresh from that object, never taken from what a filter or prioritize body said, so a
request naming a real pod's UID and resourceVersion with another body cannot change what bind does.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from tessera.api import contract
from tessera.api.assignment import Assignment
from tessera.cluster.topology import Locality
from tessera.extender import metrics as m
from tessera.extender.claims import (
    ClaimReadError,
    claimed_gpus,
    extended_claim_name,
    pod_claim_names,
    uses_claims,
)
from tessera.extender.handoff import Handoffs
from tessera.extender.metrics import ExtenderMetrics
from tessera.extender.node_selection import NodeFacts, why_not_selected
from tessera.extender.view import (
    Holding,
    PodRequest,
    PodRequestError,
    SchedulerCache,
    pod_key,
    pod_spec,
    shape_of,
)
from tessera.extender.wire import BadRequest, binding
from tessera.extender.wire import pod_and_nodes as _pod_and_nodes
from tessera.kube import KubeClient, KubeError
from tessera.policy.lanes.fragmentation import Shape, score_rows
from tessera.policy.lanes.packing import PackingConfig, priorities
from tessera.policy.lanes.placement import (
    Choice,
    GpuRequest,
    PlacementConfig,
    choose_gpus,
    to_priority,
    why_not,
)

CLAIMS_PATH = "/apis/resource.k8s.io/v1"
_BOUND_MEMORY = 100_000  # pods whose bind this extender remembers (a retry arrives within seconds)

log = logging.getLogger(__name__)
JsonObj = dict[str, Any]


MAX_BODY = 64 << 20  # a non-nodeCacheCapable filter carries whole Node objects: 5,000 nodes fit


class Extender:
    """The three verbs over a SchedulerCache.

    One scheduling cycle is filter then prioritize for the same pod: the pod's request is parsed once and
    cached by UID and a digest of the body it was parsed from (an edited pod, or another body naming the same
    UID, is parsed again), and prioritize skips the nodes filter rejected for that same body while the view
    is unchanged. A request that does not depend on the node is
    filtered on the view's FitIndex in a few array operations; what choose_gpus says per node and request is
    memoised in the view until that node changes.
    """

    SPEC_CACHE = 4096

    def __init__(
        self,
        kube: KubeClient | None,
        view: SchedulerCache | None = None,
        config: PlacementConfig | None = None,
        metrics: ExtenderMetrics | None = None,
        packing: PackingConfig | None = None,
        handoffs: Handoffs | None = None,
        handoff_wait_s: float = 3.0,
        claims: bool = False,
    ) -> None:
        self.kube = kube
        # lanes.api dra: watch ResourceClaims, score pods asking through them (claims.py)
        self.claims = claims
        self._claim_problems: OrderedDict[str, str] = OrderedDict()  # uid → why its claims are not scored
        # One GPU pod per node between bind and the agent's Allocate (handoff.py); None turns it off.
        self.handoffs = handoffs
        if not handoff_wait_s >= 0:
            raise ValueError(f"the handoff wait must be non-negative, got {handoff_wait_s}")
        self.handoff_wait_s = handoff_wait_s  # kept below kube-scheduler's httpTimeout for the extender
        self.view = view or SchedulerCache()
        self.view.read_claims = claims
        self.config = config or PlacementConfig()
        self.metrics = metrics or ExtenderMetrics()
        # packing: plain GPU pods are scored by FGD's rule (policy.lanes.packing), not by self.config's weights
        self.packing = packing if packing is not None or not self.config.packing else PackingConfig()
        if self.packing is not None and self.view.distribution is None:
            self.view.distribution = self.packing.distribution()
        # (uid, body digest), the shape, and the PodRequest it was made for (compared by identity)
        self._shape: tuple[tuple[Any, ...], Shape | None, PodRequest | None] | None = None
        self._digested: tuple[JsonObj, bytes | None] | None = None  # the last pod digested, and its digest
        self._locks: dict[str, asyncio.Lock] = {}
        # Binds of one pod run one at a time, and a pod this extender bound is never bound (or annotated)
        # again: when kube-scheduler's httpTimeout expires mid-bind it retries the pod on another node, and
        # the two binds would otherwise interleave — the late one overwriting tessera.io/assignment with a
        # node the pod is not on and releasing the GPUs the winning bind holds.
        self._pod_locks: dict[str, asyncio.Lock] = {}
        self._bound: OrderedDict[str, str] = OrderedDict()
        self._specs: OrderedDict[str, tuple[bytes, PodRequest | None]] = OrderedDict()
        self._filtered: OrderedDict[str, tuple[int, bytes | None, frozenset[str]]] = OrderedDict()
        # Pods refused on every node: uid → (namespace, name, the nodes refused). kube-scheduler retries
        # such a pod on the next cluster event only, and its informers may see an event (a pod ending)
        # before this view does: a retry answered from the older view left the pod waiting for minutes.
        self._refused: OrderedDict[str, tuple[str, str, frozenset[str]]] = OrderedDict()
        self._retries: set[asyncio.Task[None]] = set()
        self._keys: dict[GpuRequest, int] = {}  # request → memo key (keys are never reused)
        self._next_key = 0
        self._last: tuple[GpuRequest, int] | None = None

    # -- decisions ----------------------------------------------------------------------------------
    def _digest(self, pod: JsonObj) -> bytes | None:
        """A digest of everything a decision reads from the pod (resourceVersion, annotations, spec), so a
        cache entry is only ever reused for the very same body; None when the body cannot be serialised
        (then nothing about it is cached)."""
        last = self._digested
        if last is not None and last[0] is pod:  # the same object in the same request (held: ids not reused)
            return last[1]
        meta = pod.get("metadata") or {}
        try:
            raw = orjson.dumps([meta.get("resourceVersion"), meta.get("annotations"), pod.get("spec")])
        except TypeError:  # an integer past 64 bits, say: parse every time
            digest = None
        else:
            digest = hashlib.blake2b(raw, digest_size=16).digest()
        self._digested = (pod, digest)
        return digest

    def spec(self, pod: JsonObj) -> PodRequest | None:
        """The pod's parsed request, from the cache when this exact body (same UID and digest) was seen."""
        uid = pod.get("metadata", {}).get("uid")
        stamp = self._digest(pod) if uid else None
        if stamp is not None:
            hit = self._specs.get(uid)
            if hit is not None and hit[0] == stamp:
                self._specs.move_to_end(uid)
                return hit[1]
        parsed = pod_spec(pod, self.view.hp_priority_classes)
        if stamp is not None:
            self._specs[uid] = (stamp, parsed)
            if len(self._specs) > self.SPEC_CACHE:
                self._specs.popitem(last=False)
        return parsed

    def _check(
        self, spec: PodRequest | None, node: str, resolved: dict[int | None, GpuRequest | str]
    ) -> tuple[str, str] | None:
        """None when the pod fits on `node`, else (reason code, why not); cheap for fitting nodes.

        The code is one of the fixed set in tessera.extender.metrics (a low-cardinality metric label).
        """
        summary = self.view.summary(node, self.config)
        if summary is None:
            why = self.view.node_errors.get(node, f"node has no {contract.ANN_NODE_GPUS} annotation")
            return m.NO_INVENTORY, why
        if spec is None:
            return m.NO_GPU_REQUEST, "pod asks for no tessera.io GPU resource"
        if spec.problem is not None:
            return m.BAD_REQUEST, spec.problem
        if spec.placement_problem is not None:
            return m.BAD_PLACEMENT, spec.placement_problem
        req = self._resolve(spec, node, resolved)
        if isinstance(req, str):
            return m.BAD_REQUEST, req
        if spec.placement is not None or not summary.fits(req):
            if spec.placement is not None and spec.placement.node != node:
                return m.PLACED_ELSEWHERE, self._placed_elsewhere(spec)
            out = self._choose(spec, node, req)
            return (m.NO_FIT, out) if isinstance(out, str) else None
        return None

    def shape(self, pod: JsonObj, spec: PodRequest | None) -> Shape | None:
        """The pod's shape (CPU, memory, GPU models and GPU request), parsed once per pod body and spec."""
        uid = pod.get("metadata", {}).get("uid")
        stamp = (uid, self._digest(pod) if uid else None)
        cached = self._shape
        if cached is None or cached[0] != stamp or cached[2] is not spec or stamp[1] is None:
            cached = self._shape = (stamp, shape_of(spec, pod, self.view.smallest_gpu_memory()), spec)
        return cached[1]

    def claim_shape(self, pod: JsonObj, plain: Shape) -> Shape | None:
        """The shape of a pod asking for GPUs through ResourceClaims (`plain`: its CPU and memory): `plain`
        when its claims ask no gpu.tessera.io device; None, with the reason logged once, when they cannot be
        read (then every node gets the same priority and kube-scheduler's own scores decide)."""
        uid = str(pod["metadata"].get("uid") or pod_key(pod))
        try:
            req = self.view.claim_request(pod)
        except ClaimReadError as err:
            if self._claim_problems.get(uid) != str(err):
                self._claim_problems[uid] = str(err)
                while len(self._claim_problems) > self.SPEC_CACHE:
                    self._claim_problems.popitem(last=False)
                log.info("%s: not scored by the packing rule: %s", pod_key(pod), err)
            return None
        self._claim_problems.pop(uid, None)
        if req is None:
            return plain
        compute = req.compute_percent / 100.0
        if req.memory_mib is None:  # all of each GPU's memory, the capacity's default
            return Shape(req.gpus, compute, 0.0, 1.0, plain.cpu_milli, plain.memory_mib, None)
        return Shape(req.gpus, compute, float(req.memory_mib), 0.0, plain.cpu_milli, plain.memory_mib, None)

    async def fetch_claims(self, args: JsonObj) -> None:
        """Read the claims a pod of a filter or prioritize call names that the watch has not brought yet (the
        resource claim controller makes a template's claim moments before kube-scheduler asks)."""
        pod = args.get("Pod")
        if not self.claims or self.kube is None or not isinstance(pod, dict) or not uses_claims(pod):
            return
        ns = (pod.get("metadata") or {}).get("namespace") or "default"
        try:
            names = pod_claim_names(pod)
        except ClaimReadError:
            return
        for name in names:
            if f"{ns}/{name}" in self.view.claims:
                continue
            try:
                claim = await self.kube.request("GET", f"{CLAIMS_PATH}/namespaces/{ns}/resourceclaims/{name}")
            except KubeError as err:
                log.info("cannot read claim %s/%s: %s", ns, name, err)
                continue
            self.view.apply_claim(claim)

    def _node_fit(self, pod: JsonObj, spec: PodRequest | None, node: str) -> tuple[str, str] | None:
        shape = self.shape(pod, spec)
        why = None if shape is None else self.view.why_not_node(node, shape)
        return None if why is None else (m.NO_FIT, why)

    def _resolve(
        self, spec: PodRequest, node: str, resolved: dict[int | None, GpuRequest | str]
    ) -> GpuRequest | str:
        size = self.view.min_memory(node)
        req = resolved.get(size)
        if req is None:
            try:
                req = spec.resolve(size)
            except PodRequestError as err:
                req = str(err)
            resolved[size] = req
        return req

    @staticmethod
    def _placed_elsewhere(spec: PodRequest) -> str:
        assert spec.placement is not None
        return f"pod is placed on node {spec.placement.node} by {contract.ANN_PLACEMENT}"

    def _choose(self, spec: PodRequest, node: str, req: GpuRequest) -> Choice | str:
        if spec.placement is not None:
            if spec.placement.node != node:
                return self._placed_elsewhere(spec)
            return choose_gpus(
                self.view.nodes[node],
                req,
                self.config,
                only=spec.placement.gpu_indices,
                summary=self.view.summary(node, self.config),
            )
        picked = self._packing_choice(spec, node, req)
        if picked is not None:
            return picked
        memo = self.view.memo(node, self.config)
        key = self._key(req)
        out = memo.get(key) if memo is not None else None
        if out is None:
            out = choose_gpus(
                self.view.nodes[node], req, self.config, summary=self.view.summary(node, self.config)
            )
            if memo is not None:
                memo[key] = out
        return out

    def _key(self, req: GpuRequest) -> int:
        """The request's memo key (the last one is remembered: a cycle asks for the same request per node)."""
        last = self._last
        if last is not None and last[0] is req:
            return last[1]
        key = self._keys.get(req)
        if key is None:
            if len(self._keys) >= self.SPEC_CACHE:
                self._keys.clear()  # old keys' memo entries go stale, never wrong: keys are not reused
            key = self._keys[req] = self._next_key
            self._next_key += 1
        self._last = (req, key)
        return key

    def _fixed_request(self, spec: PodRequest | None) -> GpuRequest | None:
        """The pod's request when it is the same on every node (memory and compute given, no placement)."""
        if spec is None or spec.problem or spec.placement_problem or spec.placement is not None:
            return None
        if not spec.memory_mib or not spec.compute_percent:
            return None
        try:
            return spec.resolve(None)
        except PodRequestError:
            return None

    def evaluate(self, pod: JsonObj, node: str) -> Choice | str:
        """Where the pod would go on `node`, or why it cannot."""
        out = self._evaluate(pod, node, self.spec(pod))
        return out if isinstance(out, Choice) else out[1]

    def _evaluate(self, pod: JsonObj, node: str, spec: PodRequest | None) -> Choice | tuple[str, str]:
        """As evaluate, for `spec`, the pod's parsed request."""
        rejected = self._check(spec, node, {}) or self._node_fit(pod, spec, node)
        if rejected is not None:
            return rejected
        assert spec is not None
        req = self._resolve(spec, node, {})
        assert isinstance(req, GpuRequest)
        choice = self._choose(spec, node, req)
        return (m.NO_FIT, choice) if isinstance(choice, str) else choice

    # -- verbs --------------------------------------------------------------------------------------
    def filter(self, args: JsonObj) -> JsonObj:
        # nodeName, nodeSelector, required node affinity and taints are not checked here: kube-scheduler's
        # own filter plugins have already removed the nodes they exclude. Bind checks them (node_selection).
        pod, names, cache_capable = _pod_and_nodes(args)
        spec = self.spec(pod)
        failed: dict[str, str] = {}
        codes: dict[str, int] = {}
        fixed = self._fixed_request(spec)
        if spec is None:
            ok = self._filter_plain(pod, names, failed, codes)
        elif fixed is not None:
            ok = self._filter_indexed(pod, spec, fixed, names, failed, codes)
        else:
            ok = self._filter_each(pod, spec, names, failed, codes)
        if codes:
            self.metrics.rejected(codes)
        self._remember_filtered(pod, failed)
        self._note_refusal(pod, ok, failed)
        return _filter_result(args, ok, failed, cache_capable)

    def _note_refusal(self, pod: JsonObj, ok: list[str], failed: dict[str, str]) -> None:
        """Remember a pod refused on every node it was offered (see `_room_freed`); forget one that fits."""
        meta = pod["metadata"]
        uid = meta.get("uid")
        if not uid:
            return
        if ok or not failed:
            self._refused.pop(uid, None)
            return
        self._refused[uid] = (meta.get("namespace") or "default", meta.get("name", ""), frozenset(failed))
        self._refused.move_to_end(uid)
        while len(self._refused) > self.SPEC_CACHE:
            self._refused.popitem(last=False)

    def _pod_event(self, pod: JsonObj, *, gone: bool) -> None:
        """Apply a watched pod to the view; when that frees what the pod held on a node, retry the pods
        refused there."""
        uid = pod["metadata"].get("uid", "")
        before = self.view.footprint(uid)
        if gone:
            self.view.delete_pod(pod)
        else:
            self.view.apply_pod(pod)
        if gone or (pod.get("spec") or {}).get("nodeName"):
            self._refused.pop(uid, None)  # bound, or gone: nothing to retry
        freed = before if before is not None and self.view.footprint(uid) is None else None
        if self.handoffs is not None:
            handed = self.handoffs.forget(uid) if gone else self.handoffs.observe(pod)
            freed = freed or handed  # binds refused while this pod waited there may go now
        if freed is not None:
            self._room_freed(freed)

    def _room_freed(self, node: str) -> None:
        """Ask kube-scheduler to retry each pod refused on `node` (once per refusal: a new refusal is
        remembered again) by bumping its tessera.io/retry annotation, which requeues it."""
        waiting = [(uid, ns, name) for uid, (ns, name, nodes) in self._refused.items() if node in nodes]
        for uid, ns, name in waiting:
            del self._refused[uid]
            if self.kube is not None:
                task = asyncio.get_running_loop().create_task(self._retry(ns, name, node))
                self._retries.add(task)
                task.add_done_callback(self._retries.discard)

    async def _retry(self, namespace: str, name: str, node: str) -> None:
        assert self.kube is not None
        try:
            await self.kube.patch_pod_annotations(
                namespace, name, {contract.ANN_RETRY: f"{node} {time.time():.3f}"}
            )
        except KubeError as err:
            if err.status != 404:  # a pod gone meanwhile needs no retry
                log.warning("could not ask for a retry of %s/%s: %s", namespace, name, err)
            return
        log.info("asked kube-scheduler to retry %s/%s: room freed on %s", namespace, name, node)

    def _filter_indexed(
        self,
        pod: JsonObj,
        spec: PodRequest | None,
        fixed: GpuRequest,
        names: list[str],
        failed: dict[str, str],
        codes: dict[str, int],
    ) -> list[str]:
        """Filter for a request that is the same on every node: all nodes at once on the FitIndex, then
        the packing arrays; only the rejected ones are looked at one by one (for why)."""
        resolved: dict[int | None, GpuRequest | str] = {}
        passed = self.view.fit_index(self.config).fits(fixed, self.view.rows(names))
        for i in np.flatnonzero(~passed).tolist():
            rejected = self._check(spec, names[i], resolved)
            if rejected is None:
                passed[i] = True  # the index is a pre-check: the node's own summary has the last word
            else:
                _reject(failed, codes, names[i], rejected)
        shape = self.shape(pod, spec)
        if shape is not None:
            # CPU, memory and GPU model of the nodes that have the GPUs: all at once on the packing arrays
            self.view.observe(pod, shape)
            st = self.view.packing_state()
            rows = self.view.packing_rows(names)
            fit = st.node_fits(np.maximum(rows, 0), shape) | (rows < 0)
            for i in np.flatnonzero(passed & ~fit).tolist():
                why = self.view.why_not_node(names[i], shape) or "node is full"
                _reject(failed, codes, names[i], (m.NO_FIT, why))
            passed &= fit
        return [names[i] for i in np.flatnonzero(passed).tolist()]

    def _filter_plain(
        self, pod: JsonObj, names: list[str], failed: dict[str, str], codes: dict[str, int]
    ) -> list[str]:
        """A pod asking for no GPU (kube-scheduler sends every pod of the profile when the extender names no
        managed resources): the nodes with its CPU and memory, GPU nodes or not."""
        shape = self.shape(pod, None)
        if shape is None:
            for name in names:
                _reject(failed, codes, name, (m.BAD_REQUEST, "pod's CPU or memory request is unreadable"))
            return []
        if not (self.claims and uses_claims(pod)):  # a claim's GPUs are learnt in prioritize, claim read
            self.view.observe(pod, shape)
        ok = []
        for name in names:
            why = self.view.why_not_node(name, shape)
            if why is None:
                ok.append(name)
            else:
                _reject(failed, codes, name, (m.NO_FIT, why))
        return ok

    def _filter_each(
        self,
        pod: JsonObj,
        spec: PodRequest | None,
        names: list[str],
        failed: dict[str, str],
        codes: dict[str, int],
    ) -> list[str]:
        """Filter node by node, for a request that resolves differently per node (or does not parse)."""
        resolved: dict[int | None, GpuRequest | str] = {}
        ok = []
        for name in names:
            rejected = self._check(spec, name, resolved) or self._node_fit(pod, spec, name)
            if rejected is None:
                ok.append(name)
            else:
                _reject(failed, codes, name, rejected)
        return ok

    def _remember_filtered(self, pod: JsonObj, failed: dict[str, str]) -> None:
        """Keep the nodes this pod's body failed on, so prioritize need not look at them again."""
        uid = pod["metadata"].get("uid")
        if uid:
            self._filtered[uid] = (self.view.generation, self._digest(pod), frozenset(failed))
            if len(self._filtered) > self.SPEC_CACHE:
                self._filtered.popitem(last=False)

    def prioritize(self, args: JsonObj) -> list[JsonObj]:
        pod, names, _ = _pod_and_nodes(args)
        spec = self.spec(pod)
        memo = self._filtered.get(pod["metadata"].get("uid") or "")
        memo_ok = (
            memo is not None
            and memo[0] == self.view.generation
            and memo[1] is not None
            and memo[1] == self._digest(pod)  # filtered for this very body, not another naming the UID
            and spec is not None
            and spec.problem is None
        )
        rejected = memo[2] if memo is not None and memo_ok else frozenset()
        busy = self._busy(pod, spec, names, rejected)
        shape = self.shape(pod, spec) if self.packing is not None else None
        if shape is not None and spec is None and self.claims and uses_claims(pod):
            shape = self.claim_shape(pod, shape)
        if shape is not None:
            return self._promise(pod, spec, self._prioritize_packing(pod, names, shape, rejected | busy))
        resolved: dict[int | None, GpuRequest | str] = {}
        out = []
        for name in names:
            score = 0
            if name in rejected:
                pass
            elif (memo_ok and name in self.view.nodes) or self._check(spec, name, resolved) is None:
                assert spec is not None
                req = self._resolve(spec, name, resolved)
                assert isinstance(req, GpuRequest)
                choice = self._choose(spec, name, req)
                if isinstance(choice, Choice) and name not in busy:
                    score = to_priority(choice.score)
            out.append({"Host": name, "Score": score})
        return self._promise(pod, spec, out)

    def _busy(
        self, pod: JsonObj, spec: PodRequest | None, names: list[str], rejected: frozenset[str]
    ) -> frozenset[str]:
        """Nodes another GPU pod holds now (handoff.Handoffs.busy): ranked last, so kube-scheduler sends this
        pod to the best node it can take at once instead of a bind that waits there (and, with arrivals
        faster than the agent's Allocates, times out). Kept when every candidate is busy: then it waits."""
        if self.handoffs is None or spec is None or spec.problem is not None:
            return frozenset()
        busy = self.handoffs.busy_nodes(pod["metadata"].get("uid") or "")
        if not busy:
            return frozenset()
        hit = busy.intersection(names)
        if not hit or all(n in hit or n in rejected for n in names):
            return frozenset()
        return frozenset(hit)

    def _promise(self, pod: JsonObj, spec: PodRequest | None, scores: list[JsonObj]) -> list[JsonObj]:
        """Promise the node ranked first to this pod until its bind ends (handoff.Handoffs.promise)."""
        uid = pod["metadata"].get("uid")
        if self.handoffs is not None and uid and scores:
            top = max(scores, key=lambda h: int(h["Score"]))
            if int(top["Score"]) > 0 and spec is not None and spec.problem is None:
                self.handoffs.promise(str(top["Host"]), str(uid))
        return scores

    def _prioritize_packing(
        self, pod: JsonObj, names: list[str], shape: Shape, rejected: frozenset[str]
    ) -> list[JsonObj]:
        """FGD's rule (policy.lanes.packing) over every candidate node at once on the packing arrays."""
        assert self.packing is not None and self.view.distribution is not None
        self.view.observe(pod, shape)
        st = self.view.packing_state()
        rows = self.view.packing_rows(names)
        keep = rows >= 0
        if rejected:
            keep &= np.fromiter((n not in rejected for n in names), dtype=bool, count=len(names))
        wl = self.view.distribution.workload(st.models)
        scored = score_rows(st, rows[keep], shape, wl, self.packing.measure, self.packing.quantize())
        by_row = np.zeros(st.rows + 1, dtype=np.int64)  # the last entry stands for rows -1 (no packing row)
        by_row[scored.rows] = priorities(scored)
        out = by_row[rows]
        if not shape.gpus:
            # A pod asking for no GPU fragments no GPU on a node without GPUs: those come first.
            plain = rows < 0
            if rejected:
                plain &= np.fromiter((n not in rejected for n in names), dtype=bool, count=len(names))
            if plain.any():
                out = np.where(plain, 10, np.minimum(out, 9))
        return [{"Host": n, "Score": p} for n, p in zip(names, out.tolist(), strict=True)]

    def _packing_choice(self, spec: PodRequest, node: str, req: GpuRequest) -> Choice | None:
        """The GPUs FGD's rule takes on `node` (None: not a packing-scored pod, or no fit by its arrays)."""
        cached = self._shape
        if self.packing is None or self.view.distribution is None or cached is None or cached[2] is not spec:
            return None
        shape = cached[1]
        if shape is None or not shape.gpus:
            return None
        st = self.view.packing_state()
        rows = self.view.packing_rows([node])
        if rows[0] < 0:
            return None
        wl = self.view.distribution.workload(st.models)
        scored = score_rows(st, rows, shape, wl, self.packing.measure, self.packing.quantize())
        if not len(scored.rows):
            return None
        gpus = self.view.gpu_indices(node, scored.gpus_of(0))
        by_index = {g.index: g for g in self.view.nodes[node]}
        if len(gpus) != req.gpus or any(why_not(by_index[i], req, self.config) for i in gpus):
            return None  # a rule the arrays do not carry (latency-critical lanes): the per-node path decides
        return Choice(
            gpus, float(priorities(scored)[0]) / 10.0, Locality.GPU if len(gpus) == 1 else Locality.MACHINE
        )

    async def bind(self, args: JsonObj) -> JsonObj:
        """Bind the pod, counting the outcome (ok, lost_race, error) with a fixed reason code."""
        result, outcome, reason = await self._bind(args)
        self.metrics.bind(outcome, reason)
        return result

    async def _bind(self, args: JsonObj) -> tuple[JsonObj, str, str]:
        ns, name, uid, node = binding(args)
        pod = self.view.pods.get(f"{ns}/{name}")
        if pod is None and self.kube is not None:
            try:
                pod = await self.kube.get_pod(ns, name)
            except KubeError as err:
                if err.status == 404:
                    return {"Error": f"pod {ns}/{name} not found"}, m.ERROR, m.POD_NOT_FOUND
                return {"Error": f"cannot read pod {ns}/{name}: {err}"}, m.ERROR, m.API_ERROR
        if pod is None:
            return {"Error": f"pod {ns}/{name} not found"}, m.ERROR, m.POD_NOT_FOUND
        if pod.get("metadata", {}).get("uid") not in (None, uid):
            why = f"pod {ns}/{name} has uid {pod['metadata']['uid']}, not {uid} (recreated?)"
            return {"Error": why}, m.ERROR, m.POD_RECREATED
        pod_lock = self._pod_locks.setdefault(uid, asyncio.Lock())
        while len(self._pod_locks) > _BOUND_MEMORY:
            oldest = next(iter(self._pod_locks))
            if self._pod_locks[oldest].locked():
                break
            del self._pod_locks[oldest]
        try:
            async with pod_lock:
                return await self._bind_locked(pod, ns, name, uid, node)
        finally:
            if self.handoffs is not None:
                self.handoffs.settle(uid)

    async def _bind_locked(
        self, pod: JsonObj, ns: str, name: str, uid: str, node: str
    ) -> tuple[JsonObj, str, str]:
        bound_to = self._bound.get(uid)
        if bound_to is not None:
            if bound_to == node:
                return {"Error": ""}, m.OK, m.NONE
            why = f"pod {ns}/{name} is already bound to {bound_to}"
            return {"Error": f"cannot bind {ns}/{name} to {node}: {why}"}, m.LOST_RACE, m.NO_FIT
        # kube-scheduler only asks to bind a node its own plugins found the pod selects; a caller reaching
        # /bind directly is held to the same rules (nodeName, nodeSelector, required affinity, taints).
        # A node the view has not seen is taken as unlabelled and untainted (_evaluate refuses it anyway).
        why_not = why_not_selected(pod, self.view.node_facts.get(node) or NodeFacts(node))
        if why_not is not None:
            return {"Error": f"cannot bind {ns}/{name} to {node}: {why_not}"}, m.ERROR, m.NODE_MISMATCH
        lock = self._locks.setdefault(node, asyncio.Lock())
        spec = pod_spec(pod, self.view.hp_priority_classes)
        if spec is None:
            async with lock:
                return await self._bind_plain(pod, ns, name, uid, node)
        if self.claims and node not in self.view.device_plugin_nodes:
            # DRA lanes: kube-scheduler's PreBind has allocated the claim it made for the pod's tessera.io/gpu,
            # which names the GPUs (and the kubelet calls no Allocate, so there is no handoff to wait for)
            async with lock:
                return await self._bind_claimed(pod, spec, ns, name, uid, node)
        if self.handoffs is None:
            async with lock:
                return await self._bind_gpu(pod, ns, name, uid, node)
        # The handoff: wait (a bounded time, within kube-scheduler's httpTimeout) for the node's lock and for
        # no other pod there to wait for its Allocate; else refuse and ask for a retry once the node is free.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.handoff_wait_s
        try:
            await asyncio.wait_for(lock.acquire(), self.handoff_wait_s)
        except TimeoutError:
            return self._handoff_refusal(ns, name, uid, node, None)
        try:
            blocker = await self.handoffs.wait_clear(node, max(0.0, deadline - loop.time()), exclude=uid)
            if blocker is not None:
                return self._handoff_refusal(ns, name, uid, node, blocker.key)
            result = await self._bind_gpu(pod, ns, name, uid, node)
            if result[1] == m.OK and self._bound.get(uid) == node:
                self.handoffs.bound(node, uid, f"{ns}/{name}", self.view.pods.get(f"{ns}/{name}"))
            return result
        finally:
            lock.release()

    def _handoff_refusal(
        self, ns: str, name: str, uid: str, node: str, blocker: str | None
    ) -> tuple[JsonObj, str, str]:
        """A bind refused because `node` is still handing a GPU to another pod; retried once it has."""
        self._refused[uid] = (ns, name, frozenset({node}))
        self._refused.move_to_end(uid)
        while len(self._refused) > self.SPEC_CACHE:
            self._refused.popitem(last=False)
        who = f"pod {blocker}" if blocker else "another pod"
        why = (
            f"cannot bind {ns}/{name} to {node} yet: {who} bound there still waits for the node agent's Allocate "
            f"(a node is handed one GPU pod at a time, as the kubelet's Allocate does not say which pod it "
            f"serves); retried when it is served"
        )
        return {"Error": why}, m.LOST_RACE, m.HANDOFF_PENDING

    async def _bind_gpu(
        self, pod: JsonObj, ns: str, name: str, uid: str, node: str
    ) -> tuple[JsonObj, str, str]:
        """Bind a GPU pod under its node's lock: choose its GPUs, write the assignment, then bind."""
        # The request as the API server holds it (`pod` is the watched or fetched object), parsed here:
        # no cache a filter or prioritize body filled is read, so no such body decides this bind.
        spec = pod_spec(pod, self.view.hp_priority_classes)
        choice = self._evaluate(pod, node, spec)
        if not isinstance(choice, Choice):
            code, why = choice
            # Capacity gone since filter said yes: another bind won the GPUs; anything else is an error.
            outcome = m.LOST_RACE if code == m.NO_FIT else m.ERROR
            return {"Error": f"cannot bind {ns}/{name} to {node}: {why}"}, outcome, code
        assert spec is not None  # _evaluate refuses a pod without a GPU request
        req = self._resolve(spec, node, {})
        assert isinstance(req, GpuRequest)
        gpus = {g.index: g for g in self.view.nodes[node]}
        assignment = Assignment(
            node=node,
            gpu_uuids=[gpus[i].uuid for i in choice.gpu_indices],
            gpu_indices=list(choice.gpu_indices),
            lane_id=self.view.lane_id(node, choice.gpu_indices[0]),
            memory_mib=req.memory_mib,
            compute_percent=req.compute_percent,
        )
        holding = Holding(node, choice.gpu_indices, assignment.lane_id, req.as_tenant())
        failed = await self._commit(ns, name, uid, assignment, holding, self.shape(pod, spec))
        if failed is not None:
            return failed
        log.info("bound %s/%s to %s GPUs %s lane %s", ns, name, node, choice.gpu_indices, assignment.lane_id)
        return {"Error": ""}, m.OK, m.NONE

    async def _commit(
        self,
        ns: str,
        name: str,
        uid: str,
        assignment: Assignment,
        holding: Holding,
        shape: Shape | None,
    ) -> tuple[JsonObj, str, str] | None:
        """Count the pod on its GPUs (and CPU and memory), write its assignment and bind it; the error
        result when the API server refused, with nothing left counted."""
        node = assignment.node
        self.view.hold(uid, holding)
        if shape is not None:
            self.view.reserve(uid, node, shape.cpu_milli, shape.memory_mib)
        try:
            if self.kube is not None:
                await self.kube.patch_pod_annotations(
                    ns, name, {contract.ANN_ASSIGNMENT: assignment.to_annotation()}
                )
                await self.kube.bind_pod(ns, name, uid, node)
        except KubeError as err:
            self.view.release(uid)
            self.view.unreserve(uid)
            return {"Error": f"binding {ns}/{name} to {node} failed: {err}"}, m.ERROR, m.API_ERROR
        self._bound[uid] = node
        while len(self._bound) > _BOUND_MEMORY:
            self._bound.popitem(last=False)
        return None

    async def _bind_claimed(
        self, pod: JsonObj, spec: PodRequest, ns: str, name: str, uid: str, node: str
    ) -> tuple[JsonObj, str, str]:
        """Bind a pod asking `tessera.io/gpu` on a node with DRA lanes: its GPUs are the ones the claim
        kube-scheduler made for it (KEP-5004) was allocated, and the assignment names exactly those, so the
        view and the operator count the GPUs the pod's lane is on. Never a GPU of the extender's choosing."""

        def refused(why: str, outcome: str, code: str) -> tuple[JsonObj, str, str]:
            return {"Error": f"cannot bind {ns}/{name} to {node}: {why}"}, outcome, code

        if spec.problem is not None:
            return refused(spec.problem, m.ERROR, m.BAD_REQUEST)
        gpus = {g.index: g for g in self.view.nodes.get(node) or ()}
        if not gpus:
            why = self.view.node_errors.get(node, f"node has no {contract.ANN_NODE_GPUS} annotation")
            return refused(why, m.ERROR, m.NO_INVENTORY)
        req = self._resolve(spec, node, {})
        if isinstance(req, str):
            return refused(req, m.ERROR, m.BAD_REQUEST)
        shape = self.shape(pod, spec)
        why_not = None if shape is None else self.view.why_not_node(node, shape)
        if why_not is not None:
            return refused(why_not, m.LOST_RACE, m.NO_FIT)
        try:
            indices = await self._claimed_gpus(ns, name, uid, node)
            if len(indices) != req.gpus:
                raise ClaimReadError(f"it holds {len(indices)} GPUs, the pod asks for {req.gpus}")
            unknown = [i for i in indices if i not in gpus]
            if unknown:
                raise ClaimReadError(
                    f"it holds gpu-{unknown[0]}, which {contract.ANN_NODE_GPUS} does not list"
                )
        except ClaimReadError as err:
            # PreBind runs before this bind, so this is not a wait: kube-scheduler retries the pod
            return refused(f"the GPUs of its claim are not known: {err}", m.ERROR, m.CLAIM_UNREAD)
        # whole GPUs, as the device plugin's lane for tessera.io/gpu alone: each GPU's memory and 100 %
        whole = GpuRequest(
            req.gpus, min(gpus[i].memory_mib for i in indices), 100, req.compute_fraction, req.workload_class
        )
        assignment = Assignment(
            node=node,
            gpu_uuids=[gpus[i].uuid for i in indices],
            gpu_indices=indices,
            lane_id=self.view.lane_id(node, indices[0]),
            memory_mib=whole.memory_mib,
            compute_percent=whole.compute_percent,
        )
        holding = Holding(node, tuple(indices), assignment.lane_id, whole.as_tenant())
        failed = await self._commit(ns, name, uid, assignment, holding, shape)
        if failed is not None:
            return failed
        log.info(
            "bound %s/%s to %s GPUs %s (its claim's) lane %s", ns, name, node, indices, assignment.lane_id
        )
        return {"Error": ""}, m.OK, m.NONE

    async def _claimed_gpus(self, ns: str, name: str, uid: str, node: str) -> list[int]:
        """The GPUs the claim made for the pod's extended resources holds, read from the API server: the
        pod's status and the claim were written by PreBind moments ago, and the watch may not have them."""
        if self.kube is None:
            raise ClaimReadError("no API server to read it from")
        try:
            pod = await self.kube.get_pod(ns, name)
            if (pod.get("metadata") or {}).get("uid") != uid:
                raise ClaimReadError(f"pod {ns}/{name} now has another uid (recreated?)")
            claim_name = extended_claim_name(pod)
            claim = await self.kube.request(
                "GET", f"{CLAIMS_PATH}/namespaces/{ns}/resourceclaims/{claim_name}"
            )
        except KubeError as err:
            raise ClaimReadError(f"cannot read it: {err}") from None
        return claimed_gpus(claim, uid, node)

    async def _bind_plain(
        self, pod: JsonObj, ns: str, name: str, uid: str, node: str
    ) -> tuple[JsonObj, str, str]:
        """Bind a pod that asks for no GPU: its CPU and memory counted on the node, no lane, no assignment."""
        shape = self.shape(pod, None)
        if shape is None:
            why = "pod's CPU or memory request is unreadable"
            return {"Error": f"cannot bind {ns}/{name} to {node}: {why}"}, m.ERROR, m.BAD_REQUEST
        why_not = self.view.why_not_node(node, shape)
        if why_not is not None:
            return {"Error": f"cannot bind {ns}/{name} to {node}: {why_not}"}, m.LOST_RACE, m.NO_FIT
        self.view.reserve(uid, node, shape.cpu_milli, shape.memory_mib)
        try:
            if self.kube is not None:
                await self.kube.bind_pod(ns, name, uid, node)
        except KubeError as err:
            self.view.unreserve(uid)
            return {"Error": f"binding {ns}/{name} to {node} failed: {err}"}, m.ERROR, m.API_ERROR
        self._bound[uid] = node
        while len(self._bound) > _BOUND_MEMORY:
            self._bound.popitem(last=False)
        log.info("bound %s/%s to %s (no GPU)", ns, name, node)
        return {"Error": ""}, m.OK, m.NONE

    # -- keeping the view -----------------------------------------------------------------------------
    async def sync_forever(self, stop: asyncio.Event, retry_seconds: float = 2.0) -> None:
        """List then watch nodes and pods; when either watch ends (error, or the server's timeout), wait and
        relist both. A relist replaces the view, so what was deleted while no watch was open is dropped."""
        assert self.kube is not None
        while not stop.is_set():
            try:
                mark = self.view.mark()
                nodes, pods = await self.kube.list_nodes(), await self.kube.list_pods()
                claims = (
                    await self.kube.request("GET", f"{CLAIMS_PATH}/resourceclaims") if self.claims else None
                )
                self.view.replace_nodes(nodes.get("items", []))
                self.view.replace_pods(pods.get("items", []), mark)
                if claims is not None:
                    self.view.replace_claims(claims.get("items", []))
                if self.handoffs is not None:
                    self.handoffs.replace(pods.get("items", []))
                # The synced view lives as long as the process: keep it out of the collector's full passes,
                # which otherwise stall a filter for tens of ms at 1,000 nodes (bench_extender.py).
                gc.collect()
                gc.freeze()
                await self._watch_both(nodes, pods, stop, claims)
                if stop.is_set():
                    break
                log.info("a watch was closed by the API server; relisting in %.0fs", retry_seconds)
            except (KubeError, KeyError, ValueError) as err:
                log.warning("watch ended (%s); relisting in %.0fs", err, retry_seconds)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), retry_seconds)

    async def _watch_both(
        self, nodes: JsonObj, pods: JsonObj, stop: asyncio.Event, claims: JsonObj | None = None
    ) -> None:
        """Watch nodes and pods (and ResourceClaims, when listed) until any watch ends or `stop` is set
        (SIGTERM must not wait for the server to close a watch); the others are then cancelled."""
        watches = [
            asyncio.create_task(
                self._watch(
                    "/api/v1/nodes",
                    nodes,
                    self.view.apply_node,
                    lambda o: self.view.delete_node(o["metadata"]["name"]),
                )
            ),
            asyncio.create_task(
                self._watch(
                    "/api/v1/pods",
                    pods,
                    lambda o: self._pod_event(o, gone=False),
                    lambda o: self._pod_event(o, gone=True),
                )
            ),
        ]
        if claims is not None:
            watches.append(
                asyncio.create_task(
                    self._watch(
                        f"{CLAIMS_PATH}/resourceclaims", claims, self.view.apply_claim, self.view.delete_claim
                    )
                )
            )
        stopping = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait([*watches, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in [*watches, stopping]:
                task.cancel()
            await asyncio.gather(*watches, stopping, return_exceptions=True)
        for task in done:
            task.result()  # the error that ended it, if any

    async def _watch(
        self, path: str, listing: JsonObj, apply: Callable[[JsonObj], None], delete: Callable[[JsonObj], None]
    ) -> None:
        assert self.kube is not None
        rv = listing.get("metadata", {}).get("resourceVersion")
        async for event in self.kube.watch(path, rv):
            kind, obj = event.get("type"), event.get("object", {})
            if kind == "DELETED":
                delete(obj)
            elif kind in ("ADDED", "MODIFIED"):
                apply(obj)
            elif kind == "ERROR":
                raise KubeError(f"watch {path}: {obj.get('message', obj)}")


def _reject(failed: dict[str, str], codes: dict[str, int], node: str, rejected: tuple[str, str]) -> None:
    """Count a node's rejection by its code and keep why, for the scheduler's FailedNodes."""
    code, failed[node] = rejected
    codes[code] = codes.get(code, 0) + 1


def _filter_result(args: JsonObj, ok: list[str], failed: dict[str, str], cache_capable: bool) -> JsonObj:
    """kube-scheduler's ExtenderFilterResult: node names when its cache holds the nodes, else the nodes."""
    result: JsonObj = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    if cache_capable:
        result["NodeNames"] = ok
    else:
        keep = set(ok)
        items = [
            n
            for n in (args.get("Nodes") or {}).get("items") or []
            if n.get("metadata", {}).get("name") in keep
        ]
        result["Nodes"] = {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items}
    return result


def _error(status: int, reason: str) -> web.Response:
    """A refused request: the status and, as kube-scheduler's own answers do, the reason in `Error`."""
    return web.Response(status=status, body=orjson.dumps({"Error": reason}), content_type="application/json")


@web.middleware
async def _json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """aiohttp's own refusals (unknown path, wrong method, body over MAX_BODY) as JSON with the reason;
    anything unexpected is logged and answered 500 without the traceback."""
    try:
        return await handler(request)
    except web.HTTPException as err:
        if err.status < 400:
            raise
        return _error(err.status, err.reason if err.text is None else err.text.strip())
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return _error(500, "internal error in the extender (see its log)")


def make_app(extender: Extender, max_body: int = MAX_BODY) -> web.Application:
    def handler(
        verb: str, fn: Callable[[JsonObj], Awaitable[Any]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            started = time.perf_counter()
            ok = False
            try:
                try:
                    body = orjson.loads(await request.read())
                except orjson.JSONDecodeError as err:
                    return _error(400, f"request body is not JSON: {err}")
                if not isinstance(body, dict):
                    return _error(400, "request body must be a JSON object")
                try:
                    result = await fn(body)
                except BadRequest as err:
                    return _error(400, str(err))
                # An extender answer carrying Error is a failed call to kube-scheduler too.
                ok = not (isinstance(result, dict) and result.get("Error"))
                return web.Response(body=orjson.dumps(result), content_type="application/json")
            finally:
                extender.metrics.request(verb, started, ok)

        return handle

    async def do_filter(body: JsonObj) -> JsonObj:
        await extender.fetch_claims(body)
        return extender.filter(body)

    async def do_prioritize(body: JsonObj) -> list[JsonObj]:
        await extender.fetch_claims(body)
        return extender.prioritize(body)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application(client_max_size=max_body, middlewares=[_json_errors])
    app.router.add_post("/filter", handler("filter", do_filter))
    app.router.add_post("/prioritize", handler("prioritize", do_prioritize))
    app.router.add_post("/bind", handler("bind", extender.bind))
    app.router.add_get("/healthz", healthz)
    return app
