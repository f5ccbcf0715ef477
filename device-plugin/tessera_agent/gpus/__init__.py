"""The node's GPUs as the agent reads them: the backend interface (NVML or a fake), the inventory it publishes
on the Node, and per-lane telemetry."""
