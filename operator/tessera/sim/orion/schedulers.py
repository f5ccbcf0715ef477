"""The sharing policies compared in Orion §6.1, plus Tessera's node policy.

Each decides, at every event, which clients' next kernels to release to their streams (see `gpu.py`).
HP kernels are released one at a time as the previous one starts, so an HP kernel is never held back by a
scheduler that admits HP work at once, and "the most recently submitted HP kernel" is the one running.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera.policy.orion.controller import SmThresholdBisection
from tessera.policy.orion.cooperative import ThrottleRule
from tessera.policy.orion.listing1 import BeKernel, OrionConfig, OrionPolicy

from .gpu import Client, ClientSpec, GpuSim


def _feed(c: Client) -> bool:
    """Release the client's next kernel if its stream is empty (streams run in order anyway)."""
    if not c.stream and c.running is None and c.head is not None:
        c.release()
        return True
    return False


@dataclass
class FreeForAll:
    """MPS (separate processes, no limits) or CUDA streams: every client launches as it goes. `priority`:
    the HP client's stream has the highest priority (GPU Streams, and the "stream priorities" ablation)."""

    name: str = "mps"
    priority: bool = False

    def cap_percent(self, client: ClientSpec) -> int:
        return 100

    def release(self, sim: GpuSim, t: float) -> None:
        for c in sim.clients:
            if not c.stream and c.head is not None:
                c.release()


@dataclass
class Temporal:
    """One client's request or iteration at a time, HP first, BE clients round-robin [code:
    `schedule_sequential`]: the GPU is time-sliced at job boundaries."""

    name: str = "temporal"
    priority: bool = False
    _rr: int = 0

    def cap_percent(self, client: ClientSpec) -> int:
        return 100

    def release(self, sim: GpuSim, t: float) -> None:
        owner = next((c for c in sim.clients if c.in_flight), None)
        if owner is None:
            hp = sim.hp
            if hp is not None and hp.head is not None:
                owner = hp
            else:
                be = [c for c in sim.be if c.head is not None]
                if be:
                    owner = be[self._rr % len(be)]
                    self._rr += 1
        if owner is not None and not owner.stream and owner.head is not None:
            owner.release()


@dataclass
class Reef:
    """REEF-N as the authors reimplemented it [code: `schedule_reef`]: HP kernels bypass BE ones; while HP
    work is in flight, each HP launch may take one BE kernel along if it is no longer and no smaller than the
    HP kernel; while HP is idle, BE clients run with up to `depth` kernels queued (software queue of 12)."""

    name: str = "reef"
    priority: bool = True
    depth: int = 12

    def cap_percent(self, client: ClientSpec) -> int:
        return 100

    def release(self, sim: GpuSim, t: float) -> None:
        hp = sim.hp
        launched = hp.release() if hp is not None and _can_feed(hp) else None
        if hp is not None and hp.in_flight:
            if launched is None:
                return
            for c in sim.be:
                k = c.head
                if k is not None and k.duration <= launched.duration and k.sm_needed >= launched.sm_needed:
                    c.release()
                    return
            return
        for c in sim.be:
            while c.head is not None and c.outstanding_kernels < self.depth:
                c.release()


def _can_feed(c: Client) -> bool:
    return not c.stream and c.running is None and c.head is not None


@dataclass
class Orion:
    """Listing 1 (`tessera.policy.orion.listing1`): HP kernels at once on a high-priority stream; each BE
    head admitted by SM size, opposite profile and the DUR_THRESHOLD throttle; BE clients round-robin.

    `hp_limit`: for a training HP, SM_THRESHOLD is bisected on [0, max BE sm_needed] from the middle, every
    `window` HP iterations, against this iteration-time limit (seconds), as the authors' scheduler does."""

    hp_latency: float
    config: OrionConfig = field(default_factory=OrionConfig)
    name: str = "orion"
    priority: bool = True
    hp_limit: float | None = None
    window: int = 10
    _policy: OrionPolicy | None = None
    _bisect: SmThresholdBisection | None = None
    _seen: int = 0
    _rr: int = 0

    def cap_percent(self, client: ClientSpec) -> int:
        return 100

    def _tune(self, sim: GpuSim, pol: OrionPolicy) -> None:
        hp = sim.hp
        if self.hp_limit is None or hp is None or hp.spec.arrivals is not None:
            return
        if self._bisect is None:
            self._bisect = SmThresholdBisection(max(k.sm_needed for c in sim.be for k in c.spec.kernels))
            pol.sm_threshold = int(self._bisect.threshold)
        if len(hp.latencies) >= self._seen + self.window:
            recent = [x for _, x in hp.latencies[self._seen : self._seen + self.window]]
            self._seen += self.window
            pol.sm_threshold = self._bisect.observe(sum(recent) / len(recent) > self.hp_limit)

    def release(self, sim: GpuSim, t: float) -> None:
        if self._policy is None:
            self._policy = OrionPolicy(self.config, self.hp_latency)
        pol = self._policy
        self._tune(sim, pol)
        hp = sim.hp
        be = sim.be
        while True:
            pol.new_round()
            if hp is not None and _can_feed(hp):
                hp.release()
            hp_running = hp is not None and hp.in_flight
            hp_profile = None
            if hp is not None and hp_running:
                cur = hp.running.kernel if hp.running is not None else hp.spec.kernels[hp.stream[0]]
                hp_profile = cur.profile
            released = False
            n = len(be)
            for j in range(n):
                c = be[(self._rr + j) % n]
                k = c.head
                if k is None:
                    continue
                all_done = all(b.outstanding_kernels == 0 for b in be)
                if pol.admit(hp_running, hp_profile, BeKernel(k.sm_needed, k.profile, k.duration), all_done):
                    c.release()
                    released = True
            self._rr += 1
            if not released:
                return


@dataclass
class TesseraNode:
    """What Tessera's node agent can do without intercepting kernels: an MPS active-thread cap on BE
    clients, MPS client priority for the HP client (`priority`; the paper notes stream priorities may not be
    honoured under MPS, Orion §6.4), and the opt-in cooperative throttle of BE processes at module granularity
    (`tessera.policy.orion.cooperative`); `throttle=None` is caps and priority only."""

    be_percent: int
    throttle: ThrottleRule | None = None
    priority: bool = True
    name: str = "tessera"

    def cap_percent(self, client: ClientSpec) -> int:
        return 100 if client.hp else self.be_percent

    def release(self, sim: GpuSim, t: float) -> None:
        hp = sim.hp
        if hp is not None and _can_feed(hp):
            hp.release()
        hp_busy = hp is not None and hp.in_flight
        for c in sim.be:
            if self.throttle is None:
                _feed(c)
                continue
            m = c.spec.module_size
            while c.head is not None and c.next_idx % m == 0:
                modules = -(-c.outstanding_kernels // m)
                if not self.throttle.may_launch(hp_busy, c.outstanding_s, modules):
                    break
                for _ in range(m):  # the hook runs between modules: a module's kernels go together
                    if c.head is None:
                        break
                    c.release()
