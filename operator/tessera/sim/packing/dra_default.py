"""kube-scheduler's DRA allocator as a packing policy: where `lanes.api: dra` puts a pod whose claim names no
device (a hand-written ResourceClaimTemplate asking `gpu.tessera.io` for memory and computeShare, or whole
GPUs), placed by the default kube-scheduler (docs/dra.md, "Packing").

What is replayed of kube-scheduler v1.37 (pkg/scheduler/framework/plugins, staging dynamic-resource-allocation
structured allocator):
- Filter: NodeResourcesFit (the pod's CPU and memory free) and DynamicResources: the node's ResourceSlice must
  satisfy the claim. The structured allocator walks the slice's devices in order (the agent lists GPUs by
  index) and takes the first that fits each request: for a lane, a GPU with the compute share and memory free
  (consumable capacity); for k whole GPUs, the first k with nothing taken. Devices are never scored.
- percentageOfNodesToScore: kube-scheduler's default (adaptive: 50 − nodes/125 %, at least 5 % and 100
  nodes), searching from where the last search stopped (`deployed.nodes_to_find`).
- Score: NodeResourcesFit (LeastAllocated by default) and NodeResourcesBalancedAllocation over CPU and memory,
  which do not count the GPU shares claims take; DynamicResources scores only claims with prioritized lists
  (`firstAvailable`), which these are not. The other default plugins score the trace's bare pods alike
  (`deployed.py`'s docstring). `deployed.plugin_scores` computes them.
- selectHost: at random among the nodes of the highest total.

A pod without GPUs goes through the same profile (nothing routes it elsewhere in DRA mode).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tessera.policy.lanes.fragmentation import PackingState, Shape
from tessera.policy.lanes.packing import Pick, all_rows
from tessera.sim.packing.deployed import (
    DEFAULT_SCHEDULER,
    Profile,
    first_devices,
    nodes_to_find,
    plugin_scores,
)

# An admin's bin-packing configuration of the same profile: MostAllocated over CPU and memory, every node
# scored (what kube-scheduler offers short of a plugin that scores devices).
MOST_ALLOCATED = Profile(
    "default-scheduler", DEFAULT_SCHEDULER.weights, fit_strategy="MostAllocated", percentage=100
)


@dataclass
class DraDefault:
    """A PackingPolicy placing every pod as kube-scheduler's `profile` with DRA's allocator would."""

    profile: Profile = DEFAULT_SCHEDULER
    name: str = "dra-default"
    _start: int = 0

    def choose(self, state: PackingState, shape: Shape, rng: random.Random) -> Pick | None:
        rows = all_rows(state)
        cand = self._search(rows, state.feasible(rows, shape))
        if not len(cand):
            return None
        total = plugin_scores(state, cand, shape, self.profile)
        best = np.flatnonzero(total == total.max())
        row = int(cand[best[rng.randrange(len(best))]]) if len(best) > 1 else int(cand[best[0]])
        return row, first_devices(state, row, shape)

    def placed(self, state: PackingState, pick: Pick, shape: Shape) -> None:
        return None

    def _search(self, rows: npt.NDArray[np.intp], ok: npt.NDArray[np.bool_]) -> npt.NDArray[np.intp]:
        """The feasible nodes kube-scheduler's filter returns: from its last stop, until enough are found."""
        n = len(rows)
        want = nodes_to_find(n, self.profile.percentage)
        if want >= n:
            return rows[ok]
        order = np.roll(np.arange(n), -self._start)
        hits = np.cumsum(ok[order])
        stop = int(np.searchsorted(hits, want)) + 1 if hits[-1] >= want else n  # nodes processed
        self._start = (self._start + stop) % n
        picked = order[:stop]
        return rows[np.sort(picked[ok[picked]])]
