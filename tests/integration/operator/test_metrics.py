"""Operator metrics for TrialGroup (Fluid widths, trial progress, trial states) and ModelDeployment
(replicas), read from the /metrics text exposition of the operator's registry."""

from __future__ import annotations

import json

import kmock
from prometheus_client import generate_latest
from tessera.api import contract
from tessera.controller.handlers import Controller

from .conftest import (
    APPS,
    MDS,
    NS,
    TGS,
    add_node,
    app_body,
    job,
    md_body,
    pods,
    running_operator,
    set_pod_phase,
    status_of,
    tg_body,
    trial,
    wait_for,
)


async def test_metrics_expose_widths_progress_and_replicas(api: kmock.KubernetesEmulator) -> None:
    add_node(api, "n1", 4)
    api.objects[TGS, NS, "tg"] = tg_body("tg", [trial("a", 200), trial("b", 100)], gpus=2)
    api.objects[MDS, NS, "m"] = md_body("m", 300)
    async with running_operator(api) as ctl:
        await wait_for(lambda: status_of(api, TGS, "tg").get("trialsRunning") == 2, what="trials")
        await wait_for(lambda: status_of(api, MDS, "m").get("replicas") == 2, what="replicas")
        text = generate_latest(ctl.metrics.registry).decode()
    # h = (200, 100) on 2 GPUs: ⌊200/300·2⌋ = 1 and ⌊100/300·2⌋ = 0 → 1/c = 0.5.
    assert 'tessera_trial_width{namespace="ml",trial="a",trialgroup="tg"} 1.0' in text
    assert 'tessera_trial_width{namespace="ml",trial="b",trialgroup="tg"} 0.5' in text
    assert 'tessera_trial_progress_ratio{namespace="ml",trial="a",trialgroup="tg"} 0.0' in text
    assert 'tessera_trialgroup_trials{namespace="ml",state="running",trialgroup="tg"} 2.0' in text
    assert 'tessera_serving_replicas{modeldeployment="m",namespace="ml",state="desired"} 2.0' in text


async def test_metrics_expose_t_shared_t_independent_usage_and_pending(api: kmock.KubernetesEmulator) -> None:
    add_node(api, "n1", 4)
    api.objects[APPS, NS, "a"] = app_body("a", [job("j1", iters=1000, t=1.0, gpus=2)])
    async with running_operator(api) as ctl:
        await wait_for(lambda: status_of(api, APPS, "a").get("gpus") == 2, what="App leases")
        await wait_for(lambda: pods(api, **{contract.LABEL_APP: "a"}), what="App pod")
        await wait_for(lambda: "tessera_pending_pods{" in scrape(ctl), what="pending pods gauge")
        text = scrape(ctl)
        # Alone on 4 GPUs with demand 2 at t = start: T_id = 1000 s·GPU / min(4, 2) × N_avg 1 = 500 s (Themis Eq. 1,
        # §4.3.1); T_sh = 0 s elapsed + 1000 iters × 1 s / 2 GPUs on one machine = 500 s; ρ = 1.
        assert 'tessera_app_t_independent_seconds{app="a",namespace="ml"} 500.0' in text
        assert 'tessera_app_t_shared_seconds{app="a",namespace="ml"} 500.0' in text
        assert 'tessera_app_rho{app="a",namespace="ml"} 1.0' in text
        assert 'tessera_namespace_gpus{namespace="ml",workload="training"} 2.0' in text
        assert 'tessera_pending_pods{namespace="ml",workload="training"} 1.0' in text
        (name,) = pods(api, **{contract.LABEL_APP: "a"})
        await set_pod_phase(api, name, "Running")
        await wait_for(
            lambda: (
                'tessera_pending_pods{namespace="ml",workload="training"} 0.0'
                in generate_latest(ctl.metrics.registry).decode()
            ),
            what="pending count back to 0 once the pod runs",
        )


async def test_best_objective_is_the_lowest_reported_loss(api: kmock.KubernetesEmulator) -> None:
    add_node(api, "n1", 4)
    api.objects[TGS, NS, "tg"] = tg_body("tg", [trial("a", 200), trial("b", 100)], gpus=2)
    async with running_operator(api) as ctl:
        await wait_for(lambda: status_of(api, TGS, "tg").get("trialsRunning") == 2, what="trials")
        for t, iters, loss in (("a", 50, 0.7), ("b", 40, 0.4)):
            (name,) = pods(api, **{contract.LABEL_TRIAL: t})
            progress = json.dumps({"iterations": iters, "loss": loss})
            await set_pod_phase(api, name, "Running", **{contract.ANN_PROGRESS: progress})
        await wait_for(
            lambda: (
                'tessera_trialgroup_best_objective{namespace="ml",trialgroup="tg"} 0.4'
                in generate_latest(ctl.metrics.registry).decode()
            ),
            what="best objective 0.4",
        )


def scrape(ctl: Controller) -> str:
    return generate_latest(ctl.metrics.registry).decode()
