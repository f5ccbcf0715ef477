"""A deleted App's, TrialGroup's and ModelDeployment's series leave the operator's /metrics (the others' stay), and a trial
whose pod failed is counted under tessera_trialgroup_trials{state="failed"}."""

from __future__ import annotations

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

API = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}"


def series_of(ctl: Controller, label: str, value: str) -> list[str]:
    """The exposed `tessera_*` sample lines carrying label=value in namespace ml."""
    text = generate_latest(ctl.metrics.registry).decode()
    return [
        line
        for line in text.splitlines()
        if line.startswith("tessera_") and f'{label}="{value}"' in line and f'namespace="{NS}"' in line
    ]


async def test_deleting_an_app_and_a_trialgroup_removes_their_series(api: kmock.KubernetesEmulator) -> None:
    add_node(api, "n1", 8)
    api.objects[APPS, NS, "a"] = app_body("a", [job("j1", gpus=1)])
    api.objects[APPS, NS, "b"] = app_body("b", [job("j1", gpus=1)])
    api.objects[TGS, NS, "tg"] = tg_body("tg", [trial("x", 100), trial("y", 100)], gpus=2)
    api.objects[TGS, NS, "keep"] = tg_body("keep", [trial("x", 100)], gpus=1)
    async with running_operator(api) as ctl:
        for name in ("a", "b"):
            await wait_for(lambda n=name: status_of(api, APPS, n).get("gpus") == 1, what=f"App {name} lease")
        for name in ("tg", "keep"):
            await wait_for(lambda n=name: status_of(api, TGS, n).get("trialsRunning"), what=f"{name} runs")
        await wait_for(
            lambda: any(s.startswith("tessera_app_rho{") for s in series_of(ctl, "app", "a")), what="rho of a"
        )
        await wait_for(
            lambda: any(s.startswith("tessera_trial_width{") for s in series_of(ctl, "trialgroup", "tg")),
            what="widths of tg",
        )
        exposed = {s.split("{")[0] for s in series_of(ctl, "app", "a") + series_of(ctl, "trialgroup", "tg")}
        assert {
            "tessera_app_rho",
            "tessera_app_gpus",
            "tessera_lease_changes_total",
            "tessera_trial_width",
            "tessera_trial_progress_ratio",
            "tessera_trialgroup_trials",
        } <= exposed

        await api.delete(f"{API}/apps/a")
        await api.delete(f"{API}/trialgroups/tg")
        await wait_for(lambda: (APPS, NS, "a") not in api.objects, what="App gone")
        await wait_for(lambda: (TGS, NS, "tg") not in api.objects, what="TrialGroup gone")
        await wait_for(lambda: not series_of(ctl, "app", "a"), what="App a's series removed")
        await wait_for(lambda: not series_of(ctl, "trialgroup", "tg"), what="TrialGroup tg's series removed")
        # A later round does not bring them back; the survivors keep theirs.
        await wait_for(lambda: ctl.need(ctl.arbiter).rounds > 0, what="a round")
        rounds = ctl.need(ctl.arbiter).rounds
        ctl.need(ctl.arbiter).dirty = True
        await wait_for(lambda: ctl.need(ctl.arbiter).rounds > rounds, what="a round after the delete")
        assert not series_of(ctl, "app", "a") and not series_of(ctl, "trialgroup", "tg")
        assert any(s.startswith("tessera_app_rho{") for s in series_of(ctl, "app", "b"))
        assert any(s.startswith("tessera_trial_width{") for s in series_of(ctl, "trialgroup", "keep"))


async def test_a_trial_whose_pod_failed_counts_as_failed(api: kmock.KubernetesEmulator) -> None:
    add_node(api, "n1", 2)
    api.objects[TGS, NS, "tg"] = tg_body("tg", [trial("x", 100), trial("y", 100)], gpus=2)
    async with running_operator(api) as ctl:
        await wait_for(lambda: status_of(api, TGS, "tg").get("trialsRunning") == 2, what="trials")
        (name,) = pods(api, **{contract.LABEL_TRIAL: "x"})
        await set_pod_phase(api, name, "Failed")

        def trials(state: str) -> str:
            return f'tessera_trialgroup_trials{{namespace="{NS}",state="{state}",trialgroup="tg"}}'

        await wait_for(lambda: f"{trials('failed')} 1.0" in scrape(ctl), what="one failed trial")
        text = scrape(ctl)
        assert f"{trials('stopped')} 0.0" in text
        assert f"{trials('running')} 1.0" in text


async def test_deleting_a_modeldeployment_removes_its_replica_series(api: kmock.KubernetesEmulator) -> None:
    add_node(api, "n1", 4)
    api.objects[MDS, NS, "m"] = md_body("m", 100)
    api.objects[MDS, NS, "keep"] = md_body("keep", 100)
    async with running_operator(api) as ctl:
        for name in ("m", "keep"):
            await wait_for(
                lambda n=name: any(
                    s.startswith("tessera_serving_replicas{") for s in series_of(ctl, "modeldeployment", n)
                ),
                what=f"replicas of {name}",
            )
        await api.delete(f"{API}/modeldeployments/m")
        await wait_for(lambda: (MDS, NS, "m") not in api.objects, what="ModelDeployment gone")
        await wait_for(lambda: not series_of(ctl, "modeldeployment", "m"), what="m's series removed")
        assert series_of(ctl, "modeldeployment", "keep")


def scrape(ctl: Controller) -> str:
    return generate_latest(ctl.metrics.registry).decode()
