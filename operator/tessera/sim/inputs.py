"""The pieces every simulator input model is built from, and the one way its errors are reported.

Each input format (scenario kinds, training traces, tuning blocks) is a pydantic model made of the types
below: unknown fields are refused, numbers are finite and bounded (the caps of tessera.sim.scenario), a
number is never a string or a boolean. `validate` turns pydantic's first error into a ScenarioError whose
field is the path a user writes (`apps[3].jobs[0].gpus`), like the CRDs' admission errors.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, create_model

from tessera.sim.scenario import (
    MAX_APPS,
    MAX_BUDGET,
    MAX_GPUS,
    MAX_MACHINES,
    MAX_NUMBER,
    MAX_REQUESTS,
    MAX_RUNS,
    MAX_SECONDS,
    MAX_TRIALS,
    ScenarioError,
)

M = TypeVar("M", bound=BaseModel)

INT64 = (1 << 63) - 1

# Numbers as a scenario gives them: finite (the model config refuses NaN and infinity), never a bool or a
# string, and bounded so that no value makes a run endless.
# (Float bounds on floats and int bounds on ints: `problem` words the error by the bound's type.)
Real = Annotated[float, Strict(), Field(ge=-MAX_NUMBER, le=MAX_NUMBER)]
Positive = Annotated[float, Strict(), Field(gt=0.0, le=MAX_NUMBER)]
NonNegative = Annotated[float, Strict(), Field(ge=0.0, le=MAX_NUMBER)]
Int = Annotated[int, Strict(), Field(ge=-INT64 - 1, le=INT64)]
PositiveInt = Annotated[int, Strict(), Field(ge=1, le=INT64)]
Bool = Annotated[bool, Strict()]


class Input(BaseModel):
    """Base of every input model: unknown fields and non-finite numbers are errors."""

    # Attribute docstrings become the fields' descriptions in the published JSON Schema.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True, use_attribute_docstrings=True)


# Sizes, each under its cap from tessera.sim.scenario.
Apps = Annotated[int, Strict(), Field(ge=1, le=MAX_APPS)]
Gpus = Annotated[int, Strict(), Field(ge=1, le=MAX_GPUS)]
Machines = Annotated[int, Strict(), Field(ge=1, le=MAX_MACHINES)]
Trials = Annotated[int, Strict(), Field(ge=1, le=MAX_TRIALS)]
Runs = Annotated[int, Strict(), Field(ge=1, le=MAX_RUNS)]
Requests = Annotated[int, Strict(), Field(ge=1, le=MAX_REQUESTS)]
Budget = Annotated[int, Strict(), Field(ge=2, le=MAX_BUDGET)]  # Hyperband's R: at least two iterations
Count = Annotated[int, Strict(), Field(ge=1, le=1 << 20)]  # a count with no cap of its own (models, modes)
Seed = Annotated[int, Strict(), Field(ge=0, le=INT64)]
Seconds = Annotated[float, Strict(), Field(gt=0.0, le=float(MAX_SECONDS))]


_STRICT: dict[Any, Any] = {float: Real, int: Int, bool: Bool}


def _strict(annotation: Any) -> Any:
    """float, int and bool (and their Optional forms) as the strict, finite types above."""
    if annotation in _STRICT:
        return _STRICT[annotation]
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return Union[tuple(_strict(a) for a in typing.get_args(annotation))]  # noqa: UP007
    return annotation


def mirror(cls: type, *, exclude: frozenset[str] = frozenset(), **overrides: Any) -> type[Input]:
    """An input model with the fields of dataclass `cls` (names, types, defaults), so a scenario block that
    configures it is checked field by field; the dataclass's own checks still run when it is built.
    `overrides` replaces a field's annotation (keeping its default), or, given as (annotation, default), both."""
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in exclude or not f.init:
            continue
        default: Any = f.default
        if default is dataclasses.MISSING:
            factory: Any = f.default_factory
            default = factory() if factory is not dataclasses.MISSING else ...
        override = overrides.get(f.name, _strict(hints[f.name]))
        fields[f.name] = override if isinstance(override, tuple) else (override, default)
    return create_model(f"{cls.__name__}Input", __base__=Input, **fields)


def given(model: BaseModel) -> dict[str, Any]:
    """The fields the input set (not the defaults), as keyword arguments for the dataclass it mirrors."""
    return {k: getattr(model, k) for k in model.model_fields_set}


def one_of(names: tuple[str, ...]) -> Any:
    """A string out of `names` (an enum in the JSON Schema)."""
    return Literal[names]


def validate(model: type[M], data: Any, source: str, prefix: str = "", *, strict: bool | None = None) -> M:
    """`data` as `model`; ScenarioError naming `prefix` + the field path and what is wrong otherwise."""
    try:
        return model.model_validate(data, strict=strict)
    except ValidationError as e:
        from tessera.api.resources import field_path  # the resource models load only when a file is bad

        err = e.errors(include_url=False)[0]
        raise ScenarioError(
            source, join(prefix, field_path(err["loc"])) or "(top level)", problem(model, err)
        ) from None


def join(prefix: str, field: str) -> str:
    if not prefix:
        return field
    if not field:
        return prefix
    return f"{prefix}{field}" if field.startswith("[") else f"{prefix}.{field}"


def problem(model: type[BaseModel], err: Any) -> str:
    """pydantic's message, in the words the simulator's errors have always used where they differ."""
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    if kind == "extra_forbidden":
        known = _known_fields(model, err["loc"][:-1])
        return "unknown field" + (f"; known: {', '.join(known)}" if known else "")
    if kind == "missing":
        return "is required"
    if kind == "less_than_equal":
        return f"{value!r} is more than {ctx['le']:g}, the most a scenario accepts"
    if kind in ("greater_than", "greater_than_equal"):
        bound = ctx.get("gt", ctx.get("ge"))
        if isinstance(bound, int):
            return f"must be an integer >= {bound}, got {value!r}"
        if bound == 0:
            word = "positive" if kind == "greater_than" else "non-negative"
            return f"must be a {word} number, got {value!r}"
        return f"must be {'>' if kind == 'greater_than' else '>='} {bound:g}, got {value!r}"
    if kind == "finite_number":
        return f"{value} is not a finite number"
    if kind in ("float_type", "float_parsing"):
        return f"must be a number, got {value!r}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be an integer (a whole number), got {value!r}"
    if kind == "literal_error":
        return f"unknown {value!r}; known: {ctx.get('expected')}"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"must be a mapping, got {type(value).__name__}"
    if kind in ("list_type", "tuple_type"):
        return f"must be a list, got {type(value).__name__}"
    msg = str(err["msg"])
    return msg.removeprefix("Value error, ")


def _known_fields(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The field names of the model at `loc` inside `model` (best effort: [] when it cannot be followed)."""
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        if isinstance(part, int):
            args = typing.get_args(current)
            current = args[0] if args else None
        elif isinstance(current, type) and issubclass(current, BaseModel) and part in current.model_fields:
            current = current.model_fields[part].annotation
        elif typing.get_origin(current) is dict:
            current = typing.get_args(current)[1]
        else:
            return []
    current = _unwrap(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(current.model_fields)
    return []


def _unwrap(annotation: Any) -> Any:
    """X from Annotated[X, ...] and X | None."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            rest = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(rest) != 1:
                return annotation
            annotation = rest[0]
        else:
            return annotation
