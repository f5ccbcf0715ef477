"""The lean diff-base storage gives kopf exactly its own essence of an object, without copying status."""

from __future__ import annotations

import copy
import json
from typing import Any

import kopf
import pytest
from tessera.controller.essence import LeanDiffBaseStorage, LeanProgressStorage, essence_source


def app(status: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "tessera.io/v1alpha1",
        "kind": "App",
        "metadata": {
            "name": "a",
            "namespace": "ml",
            "uid": "u-a",
            "resourceVersion": "42",
            "generation": 3,
            "labels": {"team": "x"},
            "annotations": {
                "note": "kept",
                "kubectl.kubernetes.io/last-applied-configuration": "{}",
                "kopf.zalando.org/last-handled-configuration": '{"spec": {}}',
                "other-operator.example.com/last-handled-configuration": "{}",
            },
            "finalizers": ["tessera.io/cleanup"],
            "managedFields": [
                {"manager": m, "operation": "Update", "fieldsV1": {"f:status": {"f:leases": {}}}}
                for m in ("kubectl", "tessera", "kopf")
            ],
            **meta,
        },
        "spec": {
            "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
            "jobs": [{"name": "j", "iterTotal": 100, "iterTimeSerialSeconds": 1.0, "maxGPUs": 2}],
        },
    }
    if status is not None:
        body["status"] = status
    return body


STATUS = {
    "phase": "Running",
    "rho": 1.4,
    "leases": [{"job": "j", "gpus": ["n1/0", "n1/1"], "expiresAt": "2026-01-01T00:00:00Z"}],
    "conditions": [{"type": "Ready", "status": "True", "reason": "Leased"}],
}

CASES = {
    "plain": (app(STATUS), None),
    "no status, no labels": (app(None, labels={}), None),
    "owned": (app(STATUS, ownerReferences=[{"kind": "Deployment", "name": "d", "uid": "u"}]), None),
    "spec field": (app(STATUS), ["spec"]),
    "status field": (app(STATUS), ["status.phase"]),
    "status field as path": (app(STATUS), [("status", "rho")]),
    "metadata field": (app(STATUS), ["metadata.finalizers"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_essence_is_kopfs_own(case: str) -> None:
    raw, extra = CASES[case]
    before = copy.deepcopy(raw)
    ours = LeanDiffBaseStorage().build(body=kopf.Body(raw), extra_fields=extra)
    theirs = kopf.AnnotationsDiffBaseStorage().build(body=kopf.Body(raw), extra_fields=extra)
    assert json.dumps(ours, sort_keys=True) == json.dumps(theirs, sort_keys=True)
    assert raw == before  # neither builder touches the body it is given
    # The stored annotation (what kopf compares the next event with) is the same too.
    ours_patch, theirs_patch = kopf.Patch(), kopf.Patch()
    LeanDiffBaseStorage().store(body=kopf.Body(raw), patch=ours_patch, essence=ours)
    kopf.AnnotationsDiffBaseStorage().store(body=kopf.Body(raw), patch=theirs_patch, essence=theirs)
    assert dict(ours_patch) == dict(theirs_patch)


def test_status_and_managed_fields_are_not_copied() -> None:
    src = essence_source(app(STATUS), None)
    assert "status" not in src and set(src["metadata"]) == {"name", "namespace", "labels", "annotations"}
    assert "status" in essence_source(app(STATUS), ["status.phase"])


def _with_progress(raw: dict[str, Any]) -> dict[str, Any]:
    """The body as kopf leaves it mid-handling: progress of a handler in an annotation and (objects
    handled by older kopf) in status.kopf.progress."""
    out = copy.deepcopy(raw)
    out["metadata"]["annotations"]["kopf.zalando.org/app_reconcile"] = '{"started": "2026-01-01T00:00:00"}'
    out["metadata"]["annotations"]["kopf.zalando.org/touch-dummy"] = "x"
    out.setdefault("status", {})["kopf"] = {"progress": {"app_reconcile": {"retries": 1}}, "dummy": "y"}
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_progress_is_cleared_as_kopf_clears_it_without_copying_the_spec(case: str) -> None:
    raw, extra = CASES[case]
    fields = [*(extra or []), "status"]  # keep status in the essence too, where the progress may be
    for body in (raw, _with_progress(raw)):
        essence = kopf.AnnotationsDiffBaseStorage().build(body=kopf.Body(body), extra_fields=fields)
        before = copy.deepcopy(essence)
        ours = LeanProgressStorage().clear(essence=essence)
        theirs = kopf.SmartProgressStorage().clear(essence=essence)
        assert json.dumps(ours, sort_keys=True) == json.dumps(theirs, sort_keys=True)
        assert essence == before  # the essence given is left as it was
        if "spec" in essence:
            assert ours["spec"] is essence["spec"]  # shared, not copied
