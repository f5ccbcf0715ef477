"""The three top-level resources, their CRD presentation, and parsing with actionable errors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tessera.api import contract
from tessera.api.app import AppSpec, AppStatus
from tessera.api.base import ObjectMeta, WireModel
from tessera.api.modeldeployment import ModelDeploymentSpec, ModelDeploymentStatus
from tessera.api.queue import QueueSpec, QueueStatus
from tessera.api.safe_load import path_step, value_problems
from tessera.api.trialgroup import TrialGroupSpec, TrialGroupStatus

SpecT = TypeVar("SpecT", bound=WireModel)
StatusT = TypeVar("StatusT", bound=WireModel)


class Resource(BaseModel, Generic[SpecT, StatusT]):
    """A whole manifest: apiVersion, kind, metadata, spec and (optionally) status."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    api_version: Literal["tessera.io/v1alpha1"] = Field(alias="apiVersion")
    metadata: ObjectMeta
    spec: SpecT
    status: StatusT | None = None


class App(Resource[AppSpec, AppStatus]):
    """Training jobs that should finish fairly (Themis)."""

    kind: Literal["App"]


class TrialGroup(Resource[TrialGroupSpec, TrialGroupStatus]):
    """Hyper-parameter trials to finish fast (Fluid)."""

    kind: Literal["TrialGroup"]


class ModelDeployment(Resource[ModelDeploymentSpec, ModelDeploymentStatus]):
    """A model served under a latency SLO (Orloj, Symphony, AlpaServe)."""

    kind: Literal["ModelDeployment"]


class Queue(Resource[QueueSpec, QueueStatus]):
    """A team's guaranteed share of the cluster's GPUs, its maximum and its weight (cluster-scoped)."""

    kind: Literal["Queue"]


AnyResource = App | TrialGroup | ModelDeployment | Queue


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    type: Literal["string", "integer", "number", "date"]
    json_path: str
    description: str


@dataclass(frozen=True)
class ResourceKind:
    """How one kind is presented by its CRD."""

    kind: str
    plural: str
    short_names: tuple[str, ...]
    model: type[App] | type[TrialGroup] | type[ModelDeployment] | type[Queue]
    spec_model: type[WireModel]
    status_model: type[WireModel]
    columns: tuple[PrinterColumn, ...] = field(default_factory=tuple)
    scope: Literal["Namespaced", "Cluster"] = "Namespaced"

    @property
    def singular(self) -> str:
        return self.kind.lower()


_AGE = PrinterColumn("Age", "date", ".metadata.creationTimestamp", "Time since creation.")
_READY = PrinterColumn(
    "Ready", "string", '.status.conditions[?(@.type=="Ready")].status', "The Ready condition's status."
)

KINDS: dict[str, ResourceKind] = {
    contract.KIND_APP: ResourceKind(
        kind=contract.KIND_APP,
        plural=contract.PLURAL_APP,
        short_names=("tapp",),
        model=App,
        spec_model=AppSpec,
        status_model=AppStatus,
        columns=(
            PrinterColumn("Phase", "string", ".status.phase", "Lifecycle phase."),
            _READY,
            PrinterColumn("GPUs", "integer", ".status.gpus", "GPUs held now."),
            PrinterColumn("Rho", "number", ".status.rho", "Finish-time fairness ρ (1 = fair share)."),
            PrinterColumn(
                "Updated",
                "date",
                ".status.updatedAt",
                "Time since the status was written: lease expiries may have been renewed since (the operator's "
                "ledger holds them) and reach status within the staleness bound.",
            ),
            _AGE,
        ),
    ),
    contract.KIND_TRIALGROUP: ResourceKind(
        kind=contract.KIND_TRIALGROUP,
        plural=contract.PLURAL_TRIALGROUP,
        short_names=("tg",),
        model=TrialGroup,
        spec_model=TrialGroupSpec,
        status_model=TrialGroupStatus,
        columns=(
            PrinterColumn("Phase", "string", ".status.phase", "Lifecycle phase."),
            _READY,
            PrinterColumn("Running", "integer", ".status.trialsRunning", "Trials running."),
            PrinterColumn("Done", "integer", ".status.trialsDone", "Trials finished."),
            PrinterColumn("GPUs", "integer", ".status.gpus", "GPUs held now."),
            _AGE,
        ),
    ),
    contract.KIND_MODELDEPLOYMENT: ResourceKind(
        kind=contract.KIND_MODELDEPLOYMENT,
        plural=contract.PLURAL_MODELDEPLOYMENT,
        short_names=("md",),
        model=ModelDeployment,
        spec_model=ModelDeploymentSpec,
        status_model=ModelDeploymentStatus,
        columns=(
            PrinterColumn("Phase", "string", ".status.phase", "Lifecycle phase."),
            _READY,
            PrinterColumn("Replicas", "integer", ".status.replicas", "Replicas serving."),
            PrinterColumn(
                "Pool", "string", ".status.pool", "Serving pool it is placed in with others, if any."
            ),
            PrinterColumn("Policy", "string", ".status.policy", "Batch scheduler the gateway runs."),
            PrinterColumn("SLO-ms", "number", ".status.sloLatencyMs", "Resolved latency SLO in ms."),
            PrinterColumn(
                "Attainment",
                "number",
                ".status.sloAttainmentPercent",
                "SLO attainment (%) the gateway measured over the last stats window.",
            ),
            PrinterColumn(
                "Goodput", "number", ".status.goodputRps", "Requests/s within the SLO over that window."
            ),
            _AGE,
        ),
    ),
    contract.KIND_QUEUE: ResourceKind(
        kind=contract.KIND_QUEUE,
        plural=contract.PLURAL_QUEUE,
        short_names=("tq",),
        model=Queue,
        spec_model=QueueSpec,
        status_model=QueueStatus,
        scope="Cluster",
        columns=(
            PrinterColumn("Guaranteed", "number", ".spec.guaranteedGPUs", "GPUs guaranteed."),
            PrinterColumn("Max", "number", ".spec.maxGPUs", "Most GPUs it may hold."),
            PrinterColumn(
                "Allocated",
                "number",
                ".status.allocatedGPUs",
                "GPUs its Apps, TrialGroups and ModelDeployments hold now.",
            ),
            PrinterColumn("Borrowed", "number", ".status.borrowedGPUs", "GPUs held above the guarantee."),
            PrinterColumn(
                "Pending",
                "integer",
                ".status.waiting",
                "Objects of every kind waiting for GPUs (status.pending says why).",
            ),
            _AGE,
        ),
    ),
}


class ManifestError(ValueError):
    """A manifest that does not describe a valid Tessera resource; `errors` holds (field path, message)."""

    def __init__(self, kind: str, name: str, errors: list[tuple[str, str]]) -> None:
        self.kind = kind
        self.name = name
        self.errors = errors
        lines = "\n".join(f"  {path}: {msg}" for path, msg in errors)
        super().__init__(f"{kind}/{name}: {len(errors)} error(s)\n{lines}")


def field_path(loc: tuple[int | str, ...]) -> str:
    """('spec', 'jobs', 0, 'maxGPUs') → spec.jobs[0].maxGPUs; a key that is not a plain name is quoted
    (`sim["a\\nb"]`), so an error stays one line whatever keys a file has."""
    out = ""
    for part in loc:
        out = path_step(out, part, index=isinstance(part, int))
    return out


def _message(err: Mapping[str, Any]) -> str:
    """pydantic's error → a short imperative message in the API server's vocabulary."""
    kind = err["type"]
    # 0.0 → 0: bounds read as the user wrote them.
    ctx = {
        k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in (err.get("ctx") or {}).items()
    }
    simple = {
        "missing": "required field is missing",
        "extra_forbidden": "unknown field (check its spelling against `kubectl explain`)",
        "greater_than_equal": "must be >= {ge}",
        "greater_than": "must be > {gt}",
        "less_than_equal": "must be <= {le}",
        "less_than": "must be < {lt}",
        "too_short": "must have at least {min_length} item(s)",
        "too_long": "must have at most {max_length} item(s)",
        "string_too_short": "must be at least {min_length} character(s)",
        "string_too_long": "must be at most {max_length} characters",
        "string_pattern_mismatch": "must match {pattern}",
        "literal_error": "must be one of {expected}",
        "int_type": "must be an integer",
        "int_from_float": "must be an integer",
        "int_parsing": "must be an integer",
        "float_type": "must be a number",
        "float_parsing": "must be a number",
        "bool_type": "must be true or false",
        "bool_parsing": "must be true or false",
        "string_type": "must be a string",
        "list_type": "must be a list",
        "dict_type": "must be a mapping",
        "model_type": "must be a mapping",
        "model_attributes_type": "must be a mapping",
        "datetime_type": "must be an RFC 3339 time",
        "datetime_parsing": "must be an RFC 3339 time",
    }
    if kind == "cross_field":
        return str(ctx["message"])
    template = simple.get(kind)
    if template is None:
        return str(err["msg"])
    return template.format(**ctx)


def validation_errors(exc: ValidationError) -> list[tuple[str, str]]:
    """(field path, message) for each problem, paths as users write them: spec.jobs[0].maxGPUs."""
    out: list[tuple[str, str]] = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        ctx = err.get("ctx") or {}
        path = field_path(loc)
        if err["type"] == "cross_field" and ctx.get("field_path"):
            path += str(ctx["field_path"])
        out.append((path, _message(err)))
    return out


def input_errors(exc: ValidationError) -> list[tuple[str, str]]:
    """`validation_errors` for a file that is not a manifest (a gateway configuration, request payloads):
    the same paths and messages, but an unknown field without the `kubectl explain` hint and a
    validator's own message without pydantic's "Value error, " in front."""
    own = {"extra_forbidden": "unknown field", "finite_number": "must be a finite number"}
    out: list[tuple[str, str]] = []
    for (path, message), err in zip(validation_errors(exc), exc.errors(), strict=True):
        message = own.get(err["type"], message)
        out.append((path.lstrip("."), message.removeprefix("Value error, ")))
    return out


def _identity(obj: Mapping[str, Any]) -> tuple[str, str]:
    kind = obj.get("kind")
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return (str(kind) if kind else "<no kind>", str(name) if name else "<no name>")


def manifest_errors(obj: object) -> list[tuple[str, str]]:
    """Every problem with one manifest as (field path, message); empty when it is valid."""
    if not isinstance(obj, Mapping):
        return [("", f"a manifest must be a mapping, got {type(obj).__name__}")]
    kind = obj.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:  # a list or mapping here is unhashable
        return [("kind", f"must be one of {', '.join(sorted(KINDS))}, got {kind!r}")]
    # NaN, infinity and integers past int64 anywhere, free-form fields included: the API server refuses them.
    problems = list(value_problems(obj))
    if problems:
        return problems
    try:
        KINDS[str(kind)].model.model_validate(obj)
    except ValidationError as exc:
        return validation_errors(exc)
    return []


def parse_resource(obj: object) -> AnyResource:
    """Parse a manifest dict of any Tessera kind; raise ManifestError with every problem found."""
    errors = manifest_errors(obj)
    if errors:
        kind, name = _identity(obj) if isinstance(obj, Mapping) else ("<not a mapping>", "<no name>")
        raise ManifestError(kind, name, errors)
    assert isinstance(obj, Mapping)
    parsed: AnyResource = KINDS[str(obj["kind"])].model.model_validate(obj)
    return parsed


def _parse_as(model: type[App] | type[TrialGroup] | type[ModelDeployment] | type[Queue], obj: object) -> Any:
    resource = parse_resource(obj)
    if not isinstance(resource, model):
        raise ManifestError(resource.kind, resource.metadata.name, [("kind", f"expected {model.__name__}")])
    return resource


def parse_app(obj: object) -> App:
    """Parse an App manifest (raises ManifestError)."""
    app: App = _parse_as(App, obj)
    return app


def parse_trialgroup(obj: object) -> TrialGroup:
    """Parse a TrialGroup manifest (raises ManifestError)."""
    tg: TrialGroup = _parse_as(TrialGroup, obj)
    return tg


def parse_modeldeployment(obj: object) -> ModelDeployment:
    """Parse a ModelDeployment manifest (raises ManifestError)."""
    md: ModelDeployment = _parse_as(ModelDeployment, obj)
    return md


def parse_queue(obj: object) -> Queue:
    """Parse a Queue manifest (raises ManifestError)."""
    q: Queue = _parse_as(Queue, obj)
    return q
