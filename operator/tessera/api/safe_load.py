"""Reading user files safely: size, encoding, nesting and non-finite numbers checked before anything else.

Every file a command reads (manifests, scenarios, traces) goes through here, so a bad file is one line
naming the file (and the field, where there is one), never a traceback:

- more than `max_bytes` bytes: refused before it is read whole;
- not UTF-8: refused with the offset of the first bad byte;
- YAML nested deeper than `max_depth`: refused from the parser's event stream, which is not recursive (the
  YAML composer is, and a deep document made it raise RecursionError);
- NaN or infinity anywhere (`.nan`, `.inf` in YAML), or an integer past 64 bits, is named by its field path
  (`value_problems`): the API server cannot hold them, and the simulator would loop on them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import yaml

if TYPE_CHECKING:
    from pydantic import BaseModel

MAX_BYTES: Final = 16 << 20
MAX_DEPTH: Final = 64
MAX_INT: Final = (1 << 63) - 1  # an int64: what the API server stores for an integer field

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
M = TypeVar("M", bound="BaseModel")


class InputError(ValueError):
    """A file that cannot be used, with the file, the field (when known) and what is wrong."""

    def __init__(self, source: str, problem: str, field: str = "") -> None:
        self.source, self.problem, self.field = source, problem, field
        super().__init__(f"{source}: {field}: {problem}" if field else f"{source}: {problem}")


def read_text(path: str | Path, max_bytes: int = MAX_BYTES) -> str:
    """The file's text; InputError when it cannot be read, is over `max_bytes` or is not UTF-8."""
    source = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as err:
        raise InputError(source, f"cannot read: {err.strerror or err}") from None
    if len(data) > max_bytes:
        raise InputError(source, f"larger than {max_bytes} bytes, the most Tessera reads")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(
            source, f"not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})"
        ) from None


def check_depth(text: str, source: str, max_depth: int = MAX_DEPTH) -> None:
    """InputError when the YAML in `text` nests mappings and sequences deeper than `max_depth`."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > max_depth:
                    raise InputError(source, f"nested more than {max_depth} levels deep")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError as err:
        raise InputError(source, f"not valid YAML: {_one_line(err)}") from None


def load_yaml_documents(text: str, source: str, max_depth: int = MAX_DEPTH) -> list[Any]:
    """Every non-empty document of `text` (YAML, so JSON too), each checked by `value_problems`."""
    check_depth(text, source, max_depth)
    try:
        docs = [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except (yaml.YAMLError, RecursionError) as err:
        raise InputError(source, f"not valid YAML: {_one_line(err)}") from None
    return docs


def load_yaml_file(path: str | Path, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """The one YAML (or JSON) document of a file, with no NaN, infinity or over-long integer in it."""
    source = str(path)
    docs = load_yaml_documents(read_text(path, max_bytes), source, max_depth)
    if len(docs) > 1:
        raise InputError(source, f"holds {len(docs)} YAML documents; expected one")
    data = docs[0] if docs else None
    for field, problem in value_problems(data):
        raise InputError(source, problem, field)
    return data


def load_json_file(path: str | Path, max_bytes: int = MAX_BYTES) -> Any:
    """The JSON document of a file, with no NaN, infinity or over-long integer in it. Read as JSON, not
    through YAML 1.1, which reads the JSON number 1e-05 as a string."""
    source = str(path)
    try:
        data = json.loads(read_text(path, max_bytes))
    except (json.JSONDecodeError, RecursionError) as err:
        raise InputError(source, f"not valid JSON: {err}") from None
    for field, problem in value_problems(data):
        raise InputError(source, problem, field)
    return data


def validated(model: type[M], data: Any, source: str) -> M:
    """`data` (a parsed file) as the pydantic `model`; InputError naming the field path of the first
    problem, as the CRDs' errors do (`models[0].policy: must be one of ...`), and how many more there are."""
    from pydantic import ValidationError

    from tessera.api.resources import input_errors  # the resource models load only when a file is bad

    try:
        return model.model_validate(data)
    except ValidationError as err:
        problems = input_errors(err)
        field, problem = problems[0]
        if len(problems) > 1:
            problem += f" (and {len(problems) - 1} more problem(s))"
        raise InputError(source, problem, field) from None


_PLAIN_KEY: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def path_step(path: str, key: int | str, *, index: bool) -> str:
    """`path` one step down: `[k]` into a list, `.k` into a mapping, and a key that is not a plain name
    quoted (`sim["a\\nb"]`), so an error stays one line whatever keys a file has."""
    if index:
        return f"{path}[{key}]"
    if not _PLAIN_KEY.fullmatch(str(key)):  # spaces, newlines, quotes, a number as a key
        return f"{path}[{json.dumps(str(key))}]"
    return f"{path}.{key}" if path else str(key)


def value_problems(data: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(field path, problem) for each NaN, infinity or integer past int64 in a parsed document.

    Paths read as users write them: `trace.generate.mean_interarrival_s`, `spec.jobs[0].maxGPUs`. Shared
    nodes (YAML anchors) are visited once, so an alias bomb costs its distinct nodes only."""
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [(prefix, data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, bool):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            yield path or "<document>", f"{value} is not a finite number"
        elif isinstance(value, int) and not -MAX_INT - 1 <= value <= MAX_INT:
            yield path or "<document>", f"{value} does not fit in a 64-bit integer"
        elif isinstance(value, dict | list):
            if id(value) in seen:
                continue
            seen.add(id(value))
            items = value.items() if isinstance(value, dict) else enumerate(value)
            children = [(path_step(path, k, index=isinstance(value, list)), v) for k, v in items]
            stack.extend(reversed(children))


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())
