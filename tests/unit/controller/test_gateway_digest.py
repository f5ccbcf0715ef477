"""The gateway Deployment's config digest is the same in every operator process, so a restarted operator
(or another replica after a failover) does not roll out every gateway for an unchanged config."""

from __future__ import annotations

import os
import subprocess
import sys

DIGEST = """
from tessera.controller.pods import Owner
from tessera.controller.serving import record_from_body

body = {
    "apiVersion": "tessera.io/v1alpha1",
    "kind": "ModelDeployment",
    "metadata": {"name": "m", "namespace": "ml", "uid": "u-m"},
    "spec": {
        "template": {"spec": {"containers": [{"name": "worker", "image": "worker:1"}]}},
        "model": {"name": "resnet", "dynamic": False},
        "slo": {"latencyMs": 100},
        "batching": {
            "supportedBatchSizes": [1, 2],
            "latencyModel": {"type": "perBatchSize", "perBatchSizeMs": [10, 15]},
        },
    },
}
rec = record_from_body(body)
rec.gpus = [["n1/0"]]
objects = dict(rec.gateway_objects(Owner("ModelDeployment", "m", "ml", "u-m"), "tessera:1"))
print(objects["deployments"]["spec"]["template"]["metadata"]["annotations"]["tessera.io/config-digest"])
"""


def digest_in_a_process(hash_seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run([sys.executable, "-c", DIGEST], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_config_digest_does_not_depend_on_the_process() -> None:
    digests = {digest_in_a_process(seed) for seed in ("1", "2")}
    assert len(digests) == 1 and digests != {""}
