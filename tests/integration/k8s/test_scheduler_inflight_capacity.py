"""kube-scheduler 1.37.2, as hack/k8s/go.mod builds it, counts a shared device's claim twice while the claim is
both allocated in its cache and still in flight (the end of PreBind). A lane pod whose filter runs in that
window is found unschedulable and, unless something else changes, no later event requeues it: it can wait
for the 5-minute flush of unschedulable pods (docs/dra.md, "Lane pods created together"). The Go test drives the scheduler's own
DRA claim tracker through Reserve, PreBind's status write and the end of PreBind; it fails once an upstream
release counts the claim once, and then the workaround in the node tests and the docs can go."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.requires import missing

MODULE = Path(__file__).resolve().parents[3] / "hack" / "k8s"


def test_a_claim_allocated_and_still_in_flight_is_counted_twice_by_the_scheduler() -> None:
    go = shutil.which("go")
    if go is None:
        missing("no Go toolchain")
    # The flags hack/k8s-assets.sh builds kube-scheduler with, so its compiled packages are reused.
    env = {**os.environ, "CGO_ENABLED": "0"}
    run = subprocess.run(
        [go, "test", "-trimpath", "-count=1", "-v", "./schedulerdra/"],
        cwd=MODULE, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "--- PASS: TestAClaimAllocatedAndStillInFlightIsCountedTwice" in run.stdout, run.stdout
