"""Pipeline stages that run: stage graphs of the bundled early-exit model (a Loop over layers) and of a
straight-line MLP, one ONNX Runtime session per stage, outputs equal to the unsplit model's."""

from __future__ import annotations

import threading
import time
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from tessera.gateway.demo_models import early_exit_model  # noqa: E402
from tessera.gateway.pipeline import (  # noqa: E402
    PipelinedModel,
    declared_layers,
    split_loop,
    split_model,
    split_nodes,
)

WIDTH = 32
MAX_LAYERS = 60


@pytest.fixture(scope="module")
def early_exit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return early_exit_model(tmp_path_factory.mktemp("ee") / "ee.onnx", width=WIDTH, max_layers=MAX_LAYERS)


@pytest.fixture(scope="module")
def unsplit(early_exit: Path) -> object:
    return ort.InferenceSession(str(early_exit))


def _requests(seed: int, count: int, hi: int = MAX_LAYERS) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        b = int(rng.integers(1, 6))
        out.append({
            "x": rng.standard_normal((b, WIDTH)).astype(np.float32),
            "n": rng.integers(0, hi + 1, (b, 1)).astype(np.int64),
        })  # fmt: skip
    return out


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_early_exit_stages_equal_unsplit(early_exit: Path, unsplit: object, stages: int) -> None:
    pm = PipelinedModel(early_exit, stages=stages, layers=24)
    assert len(pm.stages) == len(pm.sessions) == stages
    # each stage runs its own range of layers: one Loop per stage, the state handed on between them
    assert all(s.nodes.count("Loop") == 1 for s in pm.stages)
    for a, b in pairwise(pm.stages):
        assert set(a.outputs) & set(b.inputs), (a.outputs, b.inputs)
    # rows asking for 0 layers, fewer than one range, and more than `layers` (the open-ended last range)
    for req in _requests(stages, 12):
        want = unsplit.run(None, req)[0]  # type: ignore[attr-defined]
        got = pm.run(req)[0]
        np.testing.assert_array_equal(got, want)


def test_stream_overlaps_requests_and_keeps_order(early_exit: Path, unsplit: object) -> None:
    pm = PipelinedModel(early_exit, stages=3, layers=MAX_LAYERS)
    reqs = _requests(7, 20)
    outs = list(pm.run_stream(reqs))
    assert len(outs) == len(reqs)
    for req, out in zip(reqs, outs, strict=True):
        np.testing.assert_array_equal(out[0], unsplit.run(None, req)[0])  # type: ignore[attr-defined]
    assert all(t > 0 for t in pm.stage_seconds)


def test_stream_raises_a_stage_failure(early_exit: Path) -> None:
    pm = PipelinedModel(early_exit, stages=2, layers=MAX_LAYERS)
    bad = {"x": np.zeros((2, WIDTH + 1), dtype=np.float32), "n": np.ones((2, 1), dtype=np.int64)}
    with pytest.raises(Exception, match=r"(?i)dimension|shape|invalid"):
        list(pm.run_stream([*_requests(1, 2), bad, *_requests(2, 2)]))


def _stream_threads_end(deadline_s: float = 30.0) -> bool:
    """Whether every thread a stream started has ended, waiting up to `deadline_s` (a loaded machine)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        alive = [t for t in threading.enumerate() if t.name.startswith("pipeline-")]
        if not alive:
            return True
        alive[0].join(timeout=end - time.monotonic())
    return False


def test_a_stage_failure_leaves_no_thread_blocked(early_exit: Path) -> None:
    # many requests behind the bad one: before, the feeder and the first stage stayed blocked on full queues
    pm = PipelinedModel(early_exit, stages=3, layers=MAX_LAYERS)
    bad = {"x": np.zeros((2, WIDTH + 1), dtype=np.float32), "n": np.ones((2, 1), dtype=np.int64)}
    with pytest.raises(Exception, match=r"(?i)dimension|shape|invalid"):
        list(pm.run_stream([*_requests(1, 2), bad, *_requests(2, 40)]))
    assert _stream_threads_end()


def test_a_caller_that_stops_reading_ends_the_stream(early_exit: Path) -> None:
    pm = PipelinedModel(early_exit, stages=3, layers=MAX_LAYERS)
    stream = pm.run_stream(_requests(3, 40))
    assert len(next(stream)) == len(pm.output_names)
    stream.close()
    assert _stream_threads_end()


def test_ranges_follow_declared_layers(early_exit: Path) -> None:
    assert declared_layers(early_exit) == MAX_LAYERS
    stages = split_model(early_exit, 3)  # balanced over the declared 0..60 layers: 20 each
    firsts = []
    for s in stages:
        consts = [
            n for n in s.model.graph.node if n.op_type == "Constant" and n.output[0].startswith("first")
        ]
        firsts.append(int(numpy_helper.to_array(consts[0].attribute[0].t)))
    assert firsts == [0, 20, 40]


def _mlp(path: Path, widths: list[int], seed: int = 0) -> Path:
    """A straight-line MLP (MatMul, Add, Tanh per layer) with layers of different sizes."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for i, (a, b) in enumerate(pairwise(widths)):
        w = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        inits += [
            numpy_helper.from_array(w, f"W{i}"),
            numpy_helper.from_array(np.zeros(b, np.float32), f"B{i}"),
        ]
        nodes += [
            helper.make_node("MatMul", [prev, f"W{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"B{i}"], [f"a{i}"]),
            helper.make_node("Tanh", [f"a{i}"], [f"h{i}"]),
        ]
        prev = f"h{i}"
    nodes.append(helper.make_node("Add", [prev, "x_skip"], ["y"]))  # a graph input read by the last stage
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", widths[0]]),
         helper.make_tensor_value_info("x_skip", TensorProto.FLOAT, ["batch", widths[-1]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", widths[-1]])],
        initializer=inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("stages", [2, 3, 5])
def test_straight_line_model_split_by_cost(tmp_path: Path, stages: int) -> None:
    path = _mlp(tmp_path / "mlp.onnx", [16, 256, 256, 16, 16, 16, 8])
    full = ort.InferenceSession(str(path))
    pm = PipelinedModel(path, stages=stages)
    assert len(pm.stages) == stages
    assert "x_skip" in pm.stages[-1].inputs  # the runtime hands an original input on to the stage needing it
    rng = np.random.default_rng(stages)
    for b in (1, 3):
        req = {"x": rng.standard_normal((b, 16)).astype(np.float32),
               "x_skip": rng.standard_normal((b, 8)).astype(np.float32)}  # fmt: skip
        np.testing.assert_array_equal(pm.run(req)[0], full.run(None, req)[0])


def test_cost_balance_minimises_the_largest_stage(tmp_path: Path) -> None:
    """Paper §4.1's DP on per-node cost (weight elements read + 1): the 256×256 MatMul outweighs all the
    other nodes together, so the best 2-stage cut ends stage 0 right after it (largest stage 69,892)
    rather than before it (70,600), and nowhere near half the node count."""
    path = _mlp(tmp_path / "mlp.onnx", [16, 256, 256, 16, 16, 16, 8])
    s0, s1 = split_nodes(path, 2)
    assert {i.name for i in s0.model.graph.initializer} == {"W0", "B0", "W1"}
    assert s0.outputs == ("m1",) and set(s1.inputs) == {"m1", "x_skip"}


def test_bad_splits_are_refused(early_exit: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="stages"):
        PipelinedModel(early_exit, stages=0)
    with pytest.raises(ValueError, match="cannot split"):
        split_loop(early_exit, 5, 4)
    with pytest.raises(ValueError, match="non-empty stages"):
        split_nodes(_mlp(tmp_path / "m.onnx", [4, 4]), 5)
    with pytest.raises(ValueError, match="exactly one top-level Loop"):
        split_loop(_mlp(tmp_path / "m2.onnx", [4, 4, 4]), 2, 4)
    pm = PipelinedModel(early_exit, stages=2, layers=10)
    with pytest.raises(ValueError, match="missing inputs"):
        pm.run({"x": np.zeros((1, WIDTH), np.float32)})
    with pytest.raises(ValueError, match="devices"):
        PipelinedModel(early_exit, stages=2, devices=[0])
