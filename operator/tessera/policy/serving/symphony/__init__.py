"""Symphony: deferred batch scheduling and load-proportional GPU use (Symphony, Chen et al.)."""

from tessera.policy.serving.symphony.scheduler import Candidate, SymphonyScheduler, autoscale_advice

__all__ = ["Candidate", "SymphonyScheduler", "autoscale_advice"]
