"""Symphony: deferred batch scheduling and load-proportional GPU use (seed-symphony-orion part A)."""

from tessera.policy.serving.symphony.scheduler import Candidate, SymphonyScheduler, autoscale_advice

__all__ = ["Candidate", "SymphonyScheduler", "autoscale_advice"]
