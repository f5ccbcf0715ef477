"""Operator metrics for TrialGroup (Fluid widths, trial progress, trial states) and ModelDeployment
(replicas), read from the /metrics text exposition of the operator's registry."""

from __future__ import annotations

import kmock
from conftest import MDS, NS, TGS, add_node, md_body, running_operator, status_of, tg_body, trial, wait_for
from prometheus_client import generate_latest


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
