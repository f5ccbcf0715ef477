"""Small ONNX models whose execution time depends on the input, for trying and testing the data plane.

:func:`early_exit_model` builds an early-exit network: ``n`` (one integer per row) says how many
residual tanh layers a row passes through before it exits. A ``Loop`` runs ``max(n)`` iterations over the
whole batch and a ``Where`` freezes each row once it has done its own ``n`` — so a row's output does not
depend on what it is batched with, while the batch costs as much as its longest member: the padding-to-
the-longest behaviour of dynamic DNNs in Orloj Eq. 4.

Needs the ``onnx`` package (``pip install tessera[serving]``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from onnx import GraphProto


def _weights(width: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The layer's weight matrix and bias. Small weights keep tanh out of saturation so every layer does
    real work."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    b = (0.01 * rng.standard_normal(width)).astype(np.float32)
    return w, b


def _layer(width: int) -> GraphProto:
    """The Loop body: one residual tanh layer, applied to the rows whose ``n`` exceeds the iteration."""
    from onnx import TensorProto, helper

    return helper.make_graph(
        [
            helper.make_node("MatMul", ["h_in", "W"], ["hw"]),
            helper.make_node("Add", ["hw", "B"], ["hwb"]),
            helper.make_node("Tanh", ["hwb"], ["t"]),
            helper.make_node("Add", ["h_in", "t"], ["h_next"]),
            helper.make_node("Less", ["i", "n"], ["active"]),  # row still running: iteration < n
            helper.make_node("Where", ["active", "h_next", "h_in"], ["h_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "layer",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", TensorProto.FLOAT, ["batch", width]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_out", TensorProto.FLOAT, ["batch", width]),
        ],
    )


def early_exit_model(path: str | Path, *, width: int = 256, seed: int = 0, max_layers: int = 10_000) -> Path:
    """Write the early-exit model to ``path`` and return it.

    Inputs: ``x`` float32 ``[batch, width]`` and ``n`` int64 ``[batch, 1]`` (layers per row, 0 to
    ``max_layers``, declared in the model's metadata so the worker refuses other values with a 400).
    Output: ``y`` float32 ``[batch, width]``.
    """
    try:
        import onnx
        from onnx import TensorProto, helper, numpy_helper
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise RuntimeError("building the demo model needs the 'onnx' package: pip install onnx") from err
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    w, b = _weights(width, seed)
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMax", ["n"], ["n_max"], keepdims=0),
            helper.make_node("Loop", ["n_max", "true", "x"], ["y"], body=_layer(width)),
        ],
        "early_exit",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width]),
            helper.make_tensor_value_info("n", TensorProto.INT64, ["batch", 1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        initializer=[
            numpy_helper.from_array(w, "W"),
            numpy_helper.from_array(b, "B"),
            numpy_helper.from_array(np.array(True), "true"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, {"tessera.range.n": f"0:{max_layers}"})
    onnx.checker.check_model(model)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out))
    return out


def early_exit_reference(x: np.ndarray, n: np.ndarray, *, width: int = 256, seed: int = 0) -> np.ndarray:
    """The early-exit network in numpy (same weights as :func:`early_exit_model`), row by row."""
    w, b = _weights(width, seed)
    out = np.array(x, dtype=np.float32, copy=True)
    for r in range(out.shape[0]):
        for _ in range(int(n[r, 0])):
            out[r] = out[r] + np.tanh(out[r] @ w + b)
    return out
