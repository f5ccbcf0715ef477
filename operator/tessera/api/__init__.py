"""Tessera API: resource models (spec + status), CRD generation and contract constants.

Parse manifests with `parse_resource` / `parse_app` / `parse_trialgroup` / `parse_modeldeployment` / `parse_queue`
(raise `ManifestError`), or list problems with `manifest_errors`; write status with `Status.to_wire()`.
"""

from tessera.api.resources import (
    KINDS,
    App,
    ManifestError,
    ModelDeployment,
    Queue,
    TrialGroup,
    manifest_errors,
    parse_app,
    parse_modeldeployment,
    parse_queue,
    parse_resource,
    parse_trialgroup,
)

__all__ = [
    "KINDS",
    "App",
    "ManifestError",
    "ModelDeployment",
    "Queue",
    "TrialGroup",
    "manifest_errors",
    "parse_app",
    "parse_modeldeployment",
    "parse_queue",
    "parse_resource",
    "parse_trialgroup",
]
