"""Serving data plane: an Open Inference Protocol (KServe v2) gateway whose per-model batches are formed
by the ``tessera.policy.serving`` schedulers, the ONNX Runtime worker that runs them, and a load generator.
"""

from tessera.gateway.config import ConfigError, GatewayConfig, ModelConfig, build_scheduler
from tessera.gateway.server import Gateway, make_gateway_app

__all__ = ["ConfigError", "Gateway", "GatewayConfig", "ModelConfig", "build_scheduler", "make_gateway_app"]
