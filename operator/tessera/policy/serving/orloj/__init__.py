"""Orloj: distribution-aware batch scheduling for dynamic DNNs (Yu et al.)."""

from tessera.policy.serving.orloj.batch_dist import BatchDistribution, MixMode, batch_distribution
from tessera.policy.serving.orloj.histogram import CountHistogram, OnlineHistogram
from tessera.policy.serving.orloj.scheduler import CandidateOrder, OrlojConfig, OrlojScheduler
from tessera.policy.serving.orloj.score import ScoreTable, hull_coeffs, score, scores_by_slack

__all__ = [
    "BatchDistribution",
    "CandidateOrder",
    "CountHistogram",
    "MixMode",
    "OnlineHistogram",
    "OrlojConfig",
    "OrlojScheduler",
    "ScoreTable",
    "batch_distribution",
    "hull_coeffs",
    "score",
    "scores_by_slack",
]
