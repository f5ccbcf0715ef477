"""The cooperative BE throttle with a fake event source and a fake clock (no torch needed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tessera.api import contract
from tessera.policy.orion.cooperative import ThrottleRule
from tessera.throttle import CooperativeThrottle, FileHpBusy, NeverBusy


@dataclass
class FakeGpu:
    """Events complete when the fake clock passes their completion time; work queues in stream order."""

    now: float = 0.0
    busy_until: float = 0.0
    work_s: float = 1e-3

    def record(self) -> Any:
        self.busy_until = max(self.busy_until, self.now) + self.work_s
        done_at = self.busy_until
        gpu = self

        class M:
            def query(self) -> bool:
                return gpu.now >= done_at

        return M()

    def sleep(self, s: float) -> None:
        self.now += s

    def clock(self) -> float:
        return self.now


@dataclass
class Flag:
    value: bool = True

    def busy(self) -> bool:
        return self.value


def make(gpu: FakeGpu, hp: Any, **kw: Any) -> CooperativeThrottle:
    rule = ThrottleRule(threshold_s=1.5e-3, idle_depth=3)
    kw.setdefault("module_cost_s", 1e-3)
    return CooperativeThrottle(rule, hp, gpu, poll_s=1e-4, sleep=gpu.sleep, clock=gpu.clock, **kw)


def test_hp_busy_bounds_outstanding_work() -> None:
    gpu = FakeGpu()
    t = make(gpu, Flag(True))
    for i in range(20):
        t.before(f"m{i}")
        assert sum(c for _, c in t.outstanding) <= 1.5e-3 + 1e-12  # at most one module's worth queued
        t.after(f"m{i}")
    assert t.waits > 0 and t.timeouts == 0
    assert gpu.now > 15e-3  # it waited for the GPU instead of queueing 20 ms of work


def test_hp_idle_bounds_run_ahead_by_modules() -> None:
    gpu = FakeGpu()
    t = make(gpu, Flag(False))
    for _i in range(10):
        t.before()
        assert len(t.outstanding) < 3
        t.after()


def test_never_waits_when_nothing_is_outstanding_and_times_out_on_lost_events() -> None:
    class Lost:
        def record(self) -> Any:
            class M:
                def query(self) -> bool:
                    return False

            return M()

    clock = FakeGpu()
    t = CooperativeThrottle(ThrottleRule(1e-3), Flag(True), Lost(), 5e-3, poll_s=0.01, max_wait_s=0.1,
                            sleep=clock.sleep, clock=clock.clock)  # fmt: skip
    t.before()
    assert t.waits == 0
    t.after()
    t.before()
    assert t.timeouts == 1 and clock.now == pytest.approx(0.1, abs=0.02)


def test_attach_hooks_on_leaf_modules() -> None:
    calls: list[str] = []

    @dataclass
    class Mod:
        kids: list[Any] = field(default_factory=list)
        pre: list[Any] = field(default_factory=list)
        post: list[Any] = field(default_factory=list)

        def children(self) -> Any:
            return iter(self.kids)

        def register_forward_pre_hook(self, f: Any) -> str:
            self.pre.append(f)
            return "h"

        def register_forward_hook(self, f: Any) -> str:
            self.post.append(f)
            return "h"

    a, b = Mod(), Mod()
    root = Mod([a, b])
    root.named_modules = lambda: iter([("", root), ("a", a), ("b", b)])  # type: ignore[attr-defined]
    gpu = FakeGpu()
    t = make(gpu, Flag(False), module_cost_s={"a": 2e-3, "*": 1e-3})
    t.before = lambda n="": calls.append("before " + n)  # type: ignore[method-assign]
    assert len(t.attach(root)) == 4 and not root.pre  # leaves only
    a.pre[0](a, ())
    a.post[0](a, (), None)
    b.pre[0](b, ())
    assert calls == ["before a", "before b"]
    assert [c for _, c in t.outstanding] == [2e-3]


def test_file_flag_and_from_env(tmp_path: Path) -> None:
    f = tmp_path / "hp-busy"
    flag = FileHpBusy(f)
    assert not flag.busy()  # missing: idle
    f.write_text("1")
    assert flag.busy()
    f.write_text("0")
    assert not flag.busy()
    gpu = FakeGpu()
    t = CooperativeThrottle.from_env(0.0064, events=gpu, env={contract.ENV_HP_BUSY_FILE: str(f)})
    assert isinstance(t.hp, FileHpBusy) and t.rule.threshold_s == pytest.approx(160e-6)
    assert isinstance(CooperativeThrottle.from_env(0.01, events=gpu, env={}).hp, NeverBusy)


def test_torch_events_need_torch_and_cuda() -> None:
    torch = pytest.importorskip(
        "torch", reason="torch is not installed; the torch.cuda.Event source is untested"
    )
    from tessera.throttle import TorchCudaEvents

    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="not available"):
            TorchCudaEvents()
    else:
        m = TorchCudaEvents().record()
        torch.cuda.synchronize()
        assert m.query()
