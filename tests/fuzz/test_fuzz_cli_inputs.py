"""Fuzzing what `tessera validate` and `tessera simulate` read (issue 19), in process.

Each case starts from a shipped manifest or scenario, replaces one field (or a whole subtree) with a value
drawn wild — NaN, infinity, huge and negative numbers, strings, nested structures — and writes the file;
some cases are raw bytes (not UTF-8, not YAML, deeply nested). `validate_file` must return lines that each
name the file; `load_scenario` must return a scenario or raise ScenarioError naming the file. Anything else
(another exception, a traceback) fails, and each case has a deadline, so a load that does not end fails too.
Derandomized; each suite reports how many cases ran.
"""

from __future__ import annotations

import copy
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tessera.commands.simulate import load_scenario
from tessera.commands.validate import validate_file
from tessera.sim.scenario import ScenarioError

ROOT = Path(__file__).parents[2]
CASES = 250
FUZZ = settings(
    max_examples=CASES,
    derandomize=True,
    deadline=timedelta(seconds=20),  # a load that does not end fails; generous for a loaded machine
    suppress_health_check=[HealthCheck.too_slow],
    database=None,
)
MANIFESTS = sorted((ROOT / "examples").glob("*.yaml")) + sorted(
    (ROOT / "examples" / "invalid").glob("*.yaml")
)
SCENARIOS = sorted((ROOT / "operator" / "tessera" / "sim" / "data").glob("*.yaml")) + [
    p for p in sorted((ROOT / "examples" / "scenarios").glob("*.yaml")) if "trace" not in p.name
]

CHECKED_KINDS = ("training", "tuning", "serving", "placement")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 10**12, 2**63, float("nan"), float("inf"), -float("inf"), 1e308, 0.5]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
wild = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every field and list item of a parsed document, as key paths."""
    out = [prefix]
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        out += _paths(value, (*prefix, key))
    return out


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


@st.composite
def files(draw: st.DrawFn, sources: list[Path]) -> bytes:
    """A shipped file with one field replaced by a wild value (several, sometimes), or raw bytes."""
    kind = draw(st.integers(0, 15))
    if kind == 0:
        return draw(st.binary(max_size=200))
    if kind == 1:
        depth = draw(st.integers(60, 3000))
        return draw(
            st.sampled_from([b"a: " + b"[" * depth + b"]" * depth, b"a: " + b"{b: " * depth + b"}" * depth])
        )
    source = draw(st.sampled_from(sources))
    docs = [d for d in yaml.safe_load_all(source.read_text()) if d is not None]
    # The Tessera object of the file, not the Namespace an example creates beside it.
    doc = next((d for d in docs if str(d.get("apiVersion", "")).startswith("tessera.io/")), docs[0])
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        doc = _replace(doc, draw(st.sampled_from(paths[1:] or paths)), draw(wild))
    text = yaml.safe_dump(doc, allow_unicode=True).encode()
    if kind == 2:  # a byte that is not UTF-8 somewhere in the file
        at = draw(st.integers(0, len(text)))
        text = text[:at] + b"\xff" + text[at:]
    return text


def _write(data: bytes, directory: Path, name: str) -> Path:
    path = directory / name
    path.write_bytes(data)
    return path


def test_validate_names_the_file_on_every_line() -> None:
    ran: list[int] = []
    directory = Path(tempfile.mkdtemp(prefix="fuzz-validate-"))

    @FUZZ
    @given(data=files(MANIFESTS))
    def case(data: bytes) -> None:
        path = _write(data, directory, "manifest.yaml")
        lines = validate_file(path)
        assert lines, "no answer"
        for line in lines:
            assert line.startswith((f"OK {path}", f"SKIP {path}", f"{path}: ")) and "\n" not in line, line
            assert "Traceback" not in line
        ran.append(1)

    case()
    print(f"tessera validate: {len(ran)} generated cases")
    assert len(ran) >= 200


def test_simulate_loads_or_refuses_naming_the_file() -> None:
    ran: list[int] = []
    directory = Path(tempfile.mkdtemp(prefix="fuzz-simulate-"))
    for trace in (ROOT / "examples" / "scenarios").glob("*trace*"):  # scenarios name their traces relatively
        (directory / trace.name).write_bytes(trace.read_bytes())

    @FUZZ
    @given(data=files(SCENARIOS))
    def case(data: bytes) -> None:
        path = _write(data, directory, "scenario.yaml")
        try:
            load_scenario(path)
        except ScenarioError as err:
            assert str(err).startswith(f"{path}: ") and "\n" not in str(err).strip(), str(err)
            # The loaders of these kinds check every field themselves; the command's net is for the others.
            assert not err.problem.startswith(tuple(f"malformed {k} " for k in CHECKED_KINDS)), str(err)
        ran.append(1)

    case()
    print(f"tessera simulate (scenario loading): {len(ran)} generated cases")
    assert len(ran) >= 200
