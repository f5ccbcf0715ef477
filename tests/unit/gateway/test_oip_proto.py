"""The vendored Open Inference Protocol .proto and the modules generated from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROTO = ROOT / "operator" / "tessera" / "gateway" / "oip" / "open_inference_grpc.proto"


def test_generated_modules_are_current() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "gen-oip-protos"), "--check"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr


def test_proto_is_the_protocols_own_with_its_license() -> None:
    text = PROTO.read_text()
    assert text.startswith("// Copyright 2023 The KServe Authors.")
    assert "Licensed under the Apache License, Version 2.0" in text
    assert "package inference;" in text and "service GRPCInferenceService" in text
    for rpc in ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer"):
        assert f"rpc {rpc}(" in text
