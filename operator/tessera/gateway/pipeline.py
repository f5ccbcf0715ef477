"""Pipeline stages that run: an ONNX model cut into stage graphs, one ONNX Runtime session per stage,
activations handed from stage to stage.

This is AlpaServe's inter-op (pipeline) parallelism on the data plane (AlpaServe §2, §3.3, §4.1):
a group with ``pp`` stages holds stage ``k`` of every model on its ``k``-th GPU (or lane), and a request
runs through the stages in order. Two ways to cut a model:

* **Straight-line graphs** (:func:`split_nodes`): the top-level node list is cut into contiguous ranges
  with the serving DP of paper §4.1 (minimise the largest stage cost; cost = weight elements a node reads,
  plus one), each range becomes a stage graph.
* **A Loop over layers** (:func:`split_loop`), like the bundled early-exit demo model, whose layers are
  iterations of one ``Loop``: the loop is rewritten into ``stages`` chained loops over consecutive
  iteration ranges (the last one open-ended, so any trip count gives the unsplit model's result), each
  with the iteration counter offset to the range's first layer, and the graph is cut between them. Every
  layer runs the same operators on the same values as in the unsplit model, so the outputs are equal.

Stage graphs are built directly from the nodes (the equivalent of ``onnx.utils.extract_model``, which
drops the weights a ``Loop`` body reads from the enclosing graph): a stage's inputs are the tensors its
nodes, or their subgraphs, read and do not compute themselves; its outputs are what later stages or the
model's outputs need. :class:`PipelinedModel` runs the stages; :meth:`PipelinedModel.run_stream` overlaps
requests (stage ``k`` of one request with stage ``k+1`` of the one before), one thread per stage.

Needs the ``onnx`` and ``onnxruntime`` packages (``pip install tessera[serving]``).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tessera.policy.serving.alpaserve.profiles import partition_stages

if TYPE_CHECKING:  # onnx is an optional dependency of the serving extra
    from onnx import GraphProto, ModelProto, NodeProto, TensorProto

RANGE_PREFIX = "tessera.range."  # the worker's input-range metadata (see gateway.worker)


@dataclass(frozen=True)
class Stage:
    """One stage graph: the ONNX model of stage ``index`` and the tensors it takes and hands on."""

    index: int
    model: ModelProto
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[str, ...] = field(default=())  # op types, for logs and tests


def _load(model: ModelProto | str | Path) -> ModelProto:
    import onnx

    return model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))


def _subgraphs(node: NodeProto) -> list[GraphProto]:
    from onnx import AttributeProto

    out = []
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def _outer_refs(graph: GraphProto) -> set[str]:
    """Names a subgraph reads from enclosing scopes: used by its nodes (recursively), defined nowhere in it."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used |= _reads(node)
        defined |= set(node.output)
    return used - defined - {""}


def _reads(node: NodeProto) -> set[str]:
    """Every tensor a node reads: its inputs and what its subgraphs read from outside themselves."""
    names = {x for x in node.input if x}
    for g in _subgraphs(node):
        names |= _outer_refs(g)
    return names


def cut(model: ModelProto | str | Path, boundaries: Sequence[int]) -> list[Stage]:
    """Cut the top-level node list at ``boundaries`` (node indices, strictly increasing, inside the list):
    stage ``k`` holds nodes ``boundaries[k-1]`` to ``boundaries[k]``."""
    import onnx
    from onnx import helper, shape_inference

    m = shape_inference.infer_shapes(_load(model))
    g = m.graph
    nodes = list(g.node)
    edges = [0, *boundaries, len(nodes)]
    if any(b <= a for a, b in pairwise(edges)):
        raise ValueError(
            f"stage boundaries {list(boundaries)} must increase strictly within 1..{len(nodes) - 1}"
        )
    inits = {i.name: i for i in g.initializer}
    infos = {v.name: v for v in (*g.input, *g.value_info, *g.output)}
    graph_outputs = [o.name for o in g.output]
    reads = [_reads(n) for n in nodes]
    stages: list[Stage] = []
    for k in range(len(edges) - 1):
        own = nodes[edges[k] : edges[k + 1]]
        produced = {o for n in own for o in n.output if o}
        needed = set().union(*reads[edges[k] : edges[k + 1]])
        later = set().union(*reads[edges[k + 1] :], graph_outputs)
        inputs = sorted(x for x in needed - produced if x not in inits)
        outputs = sorted(x for x in produced if x in later)
        missing = [x for x in (*inputs, *outputs) if x not in infos]
        if missing:
            raise ValueError(
                f"no type known for tensors {missing} at a stage boundary (shape inference failed)"
            )
        graph = helper.make_graph(
            own,
            f"{g.name}_stage{k}",
            [infos[x] for x in inputs],
            [infos[x] for x in outputs],
            initializer=[inits[x] for x in sorted(needed & inits.keys())],
        )
        sm = helper.make_model(graph, opset_imports=list(m.opset_import))
        sm.ir_version = m.ir_version
        for p in m.metadata_props:
            sm.metadata_props.append(p)
        onnx.checker.check_model(sm)
        stages.append(Stage(k, sm, tuple(inputs), tuple(outputs), tuple(n.op_type for n in own)))
    return stages


def split_nodes(model: ModelProto | str | Path, stages: int) -> list[Stage]:
    """Cut a straight-line graph into ``stages`` stages of balanced cost (paper §4.1's DP)."""
    m = _load(model)
    nodes = list(m.graph.node)
    if not 1 <= stages <= len(nodes):
        raise ValueError(f"cannot cut {len(nodes)} top-level nodes into {stages} non-empty stages")
    sizes = {i.name: int(np.prod(i.dims)) for i in m.graph.initializer}
    cost = [1.0 + sum(sizes.get(x, 0) for x in _reads(n)) for n in nodes]
    _, ranges = partition_stages(cost, stages)
    return cut(m, [last for _, last in ranges[:-1]])


def _the_loop(g: GraphProto, stages: int, layers: int) -> int:
    """The index of the graph's one top-level ``Loop``, checked to be one :func:`split_loop` can cut: a
    trip count, a condition that stays true, no scan outputs."""
    loops = [i for i, n in enumerate(g.node) if n.op_type == "Loop"]
    if len(loops) != 1:
        raise ValueError(f"split_loop needs exactly one top-level Loop, the graph has {len(loops)}")
    if not 1 <= stages <= layers:
        raise ValueError(f"cannot split {layers} layers into {stages} stages")
    loop = g.node[loops[0]]
    body = _subgraphs(loop)[0]
    carried = len(loop.input) - 2
    if len(body.output) != 1 + carried or len(loop.output) != carried:
        raise ValueError("split_loop does not handle Loop scan outputs")
    cond_in, cond_out = body.input[1].name, body.output[0].name
    keeps_going = any(n.op_type == "Identity" and list(n.input) == [cond_in] and list(n.output) == [cond_out]
                      for n in body.node)  # fmt: skip
    if not keeps_going or not loop.input[0]:
        raise ValueError(
            "split_loop needs a Loop with a trip count whose condition stays true (no early break)"
        )
    return loops[0]


def _range_trip(trip: str, tag: str, first: TensorProto, width: int | None) -> tuple[list[NodeProto], str]:
    """Nodes computing one range's trip count, max(trip − first, 0), capped at ``width`` (None: the last,
    open-ended range), and the name of their result."""
    from onnx import TensorProto, helper

    zero = helper.make_tensor(f"zero{tag}", TensorProto.INT64, [], [0])
    nodes = [
        helper.make_node("Constant", [], [f"first{tag}"], value=first),
        helper.make_node("Constant", [], [f"zero{tag}"], value=zero),
        helper.make_node("Sub", [trip, f"first{tag}"], [f"left{tag}"]),
        helper.make_node("Max", [f"left{tag}", f"zero{tag}"], [f"left0{tag}"]),
    ]
    if width is None:
        return nodes, f"left0{tag}"
    cap = helper.make_tensor(f"width{tag}", TensorProto.INT64, [], [width])
    nodes += [
        helper.make_node("Constant", [], [f"width{tag}"], value=cap),
        helper.make_node("Min", [f"left0{tag}", f"width{tag}"], [f"trip{tag}"]),
    ]
    return nodes, f"trip{tag}"


def _range_body(body: GraphProto, tag: str, first: TensorProto) -> GraphProto:
    """The loop body for one range: it sees the global layer index, i = local iteration + first layer."""
    from onnx import TensorProto, helper

    iter_name = body.input[0].name
    return helper.make_graph(
        [
            helper.make_node("Constant", [], [f"first_b{tag}"], value=first),
            helper.make_node("Add", [f"{iter_name}{tag}", f"first_b{tag}"], [iter_name]),
            *body.node,
        ],
        f"{body.name}{tag}",
        [helper.make_tensor_value_info(f"{iter_name}{tag}", TensorProto.INT64, []), *body.input[1:]],
        list(body.output),
        initializer=list(body.initializer),
    )


def split_loop(model: ModelProto | str | Path, stages: int, layers: int) -> list[Stage]:
    """Split the iterations of the model's one top-level ``Loop`` into ``stages`` ranges of about
    ``layers / stages`` iterations (the last range open-ended) and cut the graph between them."""
    from onnx import TensorProto, helper, shape_inference

    m = shape_inference.infer_shapes(_load(model))  # a copy: the caller's model is left as it is
    g = m.graph
    li = _the_loop(g, stages, layers)
    loop = g.node[li]
    body = _subgraphs(loop)[0]
    trip, cond = loop.input[0], loop.input[1]
    infos = {v.name: v for v in (*g.value_info, *g.output)}
    bounds = [round(j * layers / stages) for j in range(stages + 1)]
    chained: list[NodeProto] = []
    boundaries: list[int] = []
    state = list(loop.input[2:])
    for j in range(stages):
        tag = f"__stage{j}"
        last = j == stages - 1
        first = helper.make_tensor(f"first{tag}", TensorProto.INT64, [], [bounds[j]])
        nodes, trip_j = _range_trip(trip, tag, first, None if last else bounds[j + 1] - bounds[j])
        outs = list(loop.output) if last else [f"{o}{tag}" for o in loop.output]
        if not last:  # the state handed to the next range has the loop output's type and shape
            for o, name in zip(loop.output, outs, strict=True):
                if o in infos:
                    v = g.value_info.add()
                    v.CopyFrom(infos[o])
                    v.name = name
        nodes.append(
            helper.make_node("Loop", [trip_j, cond, *state], outs, body=_range_body(body, tag, first))
        )
        chained += nodes
        boundaries.append(li + len(chained))
        state = outs
    new_nodes = [*g.node[:li], *chained, *g.node[li + 1 :]]
    del g.node[:]
    g.node.extend(new_nodes)
    return cut(m, boundaries[:-1])


def declared_layers(model: ModelProto | str | Path) -> int | None:
    """The largest value the model declares for an integer input (``tessera.range.<input>`` metadata):
    for the early-exit demo model, the most layers a row may ask for."""
    m = _load(model)
    his = []
    for p in m.metadata_props:
        if p.key.startswith(RANGE_PREFIX):
            try:
                his.append(int(float(p.value.split(":")[1])))
            except (IndexError, ValueError):
                continue
    return max(his) if his else None


def split_model(model: ModelProto | str | Path, stages: int, *, layers: int | None = None) -> list[Stage]:
    """:func:`split_loop` for a model whose layers are a top-level Loop (``layers``: the layer count the
    ranges are balanced for; default the declared input range), else :func:`split_nodes`."""
    m = _load(model)
    if any(n.op_type == "Loop" for n in m.graph.node):
        n_layers = layers if layers is not None else declared_layers(m)
        if n_layers is None:
            raise ValueError("the model's layers are a Loop: give layers= to balance the stages")
        return split_loop(m, stages, max(n_layers, stages))
    return split_nodes(m, stages)


_STOP = object()  # the end of the request stream
_CANCELLED = object()  # what a blocked get returns once the stream is cancelled
_POLL_S = 0.05  # how often a blocked put/get looks at the cancel flag


class _Stream:
    """The bounded queues between a stream's threads and the flag that ends them all: a put or get that
    would block forever (a neighbour gone after a failure, a caller that stopped reading) gives up once
    `cancel` is set."""

    def __init__(self, queues: int) -> None:
        self.queues: list[queue.Queue[Any]] = [queue.Queue(maxsize=2) for _ in range(queues)]
        self.cancel = threading.Event()

    def put(self, k: int, item: Any) -> bool:
        while not self.cancel.is_set():
            try:
                self.queues[k].put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def get(self, k: int) -> Any:
        while not self.cancel.is_set():
            try:
                return self.queues[k].get(timeout=_POLL_S)
            except queue.Empty:
                continue
        return _CANCELLED


class PipelinedModel:
    """A model run as ``stages`` pipeline stages, one ONNX Runtime session each.

    ``devices``: the GPU of each stage (CUDA device ids) when the CUDA provider is used; stage ``k`` of
    a group runs on the group's ``k``-th GPU. On CPU every stage gets its own session and thread.
    ``run(inputs)`` answers like the unsplit model's session (outputs in the model's output order).
    """

    def __init__(
        self,
        path: str | Path | ModelProto,
        *,
        stages: int,
        layers: int | None = None,
        provider: str = "auto",
        devices: Sequence[int] | None = None,
        threads: int = 1,
    ) -> None:
        import onnxruntime as ort  # type: ignore[import-untyped]  # only workers need onnxruntime

        if stages < 1:
            raise ValueError(f"stages must be >= 1, got {stages}")
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        m = _load(path)
        self.output_names = [o.name for o in m.graph.output]
        self.input_names = [
            i.name for i in m.graph.input if i.name not in {x.name for x in m.graph.initializer}
        ]
        self.stages = split_model(m, stages, layers=layers)
        available = ort.get_available_providers()
        if provider == "auto":
            provider = (
                "CUDAExecutionProvider" if "CUDAExecutionProvider" in available else "CPUExecutionProvider"
            )
        if provider not in available:
            raise ValueError(f"execution provider {provider!r} is not available; this build has {available}")
        if devices is not None and len(devices) != stages:
            raise ValueError(f"devices names {len(devices)} GPUs for {stages} stages")
        self.sessions = []
        for st in self.stages:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            prov: list[Any] = [provider]
            if provider == "CUDAExecutionProvider":
                dev = devices[st.index] if devices is not None else 0
                prov = [("CUDAExecutionProvider", {"device_id": dev}), "CPUExecutionProvider"]
            self.sessions.append(ort.InferenceSession(st.model.SerializeToString(), opts, providers=prov))
        self.stage_seconds = [0.0] * stages  # busy time per stage, for profiles

    def _stage(self, k: int, env: dict[str, np.ndarray]) -> None:
        st = self.stages[k]
        t0 = time.perf_counter()
        outs = self.sessions[k].run(list(st.outputs), {x: env[x] for x in st.inputs})
        self.stage_seconds[k] += time.perf_counter() - t0
        env.update(zip(st.outputs, (np.asarray(o) for o in outs), strict=True))

    def _check(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = sorted(set(self.input_names) - set(inputs))
        if missing:
            raise ValueError(f"missing inputs {missing}; the model takes {self.input_names}")
        return dict(inputs)

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """One request through every stage in turn; the activations a later stage needs are handed on."""
        env = self._check(inputs)
        for k in range(len(self.stages)):
            self._stage(k, env)
        return [env[o] for o in self.output_names]

    def run_stream(self, requests: Iterable[Mapping[str, np.ndarray]]) -> Iterator[list[np.ndarray]]:
        """Requests through the pipeline with stages overlapping: one thread per stage, a bounded queue
        between neighbours, answers in request order. ONNX Runtime releases the GIL while a stage runs.

        A stage failure is raised here after the answers before it; then, or when the caller stops
        iterating, every thread of the stream ends (none is left blocked on a full queue)."""
        n = len(self.stages)
        stream = _Stream(n + 1)
        threads = [
            threading.Thread(
                target=self._stage_loop, args=(k, stream), name=f"pipeline-stage-{k}", daemon=True
            )
            for k in range(n)
        ]
        threads.append(
            threading.Thread(target=self._feed, args=(requests, stream), name="pipeline-feed", daemon=True)
        )
        for t in threads:
            t.start()
        try:
            while (item := stream.get(n)) is not _STOP:
                if isinstance(item, BaseException):
                    raise item
                yield [item[o] for o in self.output_names]
        finally:
            stream.cancel.set()

    def _feed(self, requests: Iterable[Mapping[str, np.ndarray]], stream: _Stream) -> None:
        try:
            for r in requests:
                if not stream.put(0, self._check(r)):
                    return
        except Exception as err:
            stream.put(0, err)
            return
        stream.put(0, _STOP)

    def _stage_loop(self, k: int, stream: _Stream) -> None:
        while True:
            item = stream.get(k)
            if item is _CANCELLED:
                return
            if item is _STOP or isinstance(item, BaseException):
                stream.put(k + 1, item)
                return
            try:
                self._stage(k, item)
            except Exception as err:  # hand the failure downstream; upstream stops at the cancel
                stream.put(k + 1, err)
                return
            if not stream.put(k + 1, item):
                return
