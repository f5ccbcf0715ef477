"""Every kopf handler that reads or writes the controller's shared state runs on the event loop.

kopf runs a plain `def` handler in a worker thread. The pod and node watch handlers were plain functions:
they mutated the cluster view from threads while an arbiter round or another handler iterated it on the
loop, and at 1000 Apps against a real API server a pod event failed with "dictionary changed size during
iteration" (the pod was then missing from the view). Indexers too: the App claims index ran in a thread
for every App watch event, a thread hand-off for each of a round's own status writes."""

from __future__ import annotations

import inspect
import re

from tessera.controller.config import OperatorConfig
from tessera.controller.handlers import make_registry

# Run once, before any watch starts: login builds the controller, startup only sets kopf's settings.
BEFORE_WATCHING = {"login", "configure"}


def test_handlers_touching_shared_state_are_coroutines() -> None:
    registry, _ = make_registry(OperatorConfig())
    kinds = (
        registry._activities,
        registry._indexing,
        registry._watching,
        registry._spawning,
        registry._changing,
    )
    handlers = [h for kind in kinds for h in kind.get_all_handlers()]
    names = {str(h.id).split(".")[-1].split("/")[0] for h in handlers}
    assert {"node_event", "pod_event", "app_reconcile", "app_tick", "app_claims"} <= names
    threaded = [
        str(h.id)
        for h in handlers
        if not inspect.iscoroutinefunction(h.fn) and str(h.id).split(".")[-1] not in BEFORE_WATCHING
    ]
    assert threaded == []


def test_object_handler_ids_are_valid_annotation_names() -> None:
    """kopf names the annotation that keeps a handler's progress (an App refused admission is retried)
    after the handler's id: an id the API server refuses there (a qualified name of a nested function,
    `_app_handlers.<locals>.app_reconcile`) left the refused App's status unwritten on a real API server."""
    registry, _ = make_registry(OperatorConfig())
    kinds = (registry._watching, registry._spawning, registry._changing)
    ids = {str(h.id) for kind in kinds for h in kind.get_all_handlers()}
    name_part = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
    assert {"app_reconcile", "trialgroup_reconcile", "deployment_reconcile", "app_delete"} <= ids
    assert [i for i in ids if not name_part.fullmatch(i.replace("/", "."))] == []
