"""Tuning algorithms that emit TrialGroups and react to results (Fluid, dissertation §3.3.2-3.3.3)."""

from tessera.policy.hpo.asha import ASHA, asha, bohb
from tessera.policy.hpo.base import Config, Decision, Result, TrialRun, TrialRunGroup, TuningAlgorithm
from tessera.policy.hpo.external import ExternalTuner, ExternalTunerAlgorithm, Suggestion
from tessera.policy.hpo.grid_random import GridSearch, RandomSearch
from tessera.policy.hpo.halving import (
    Bracket,
    SyncHalving,
    hyperband,
    hyperband_brackets,
    successive_halving,
    sync_bohb,
)
from tessera.policy.hpo.pbt import PBT
from tessera.policy.hpo.search_space import SearchSpace
from tessera.policy.hpo.tpe import TPESampler

__all__ = [
    "ASHA",
    "PBT",
    "Bracket",
    "Config",
    "Decision",
    "ExternalTuner",
    "ExternalTunerAlgorithm",
    "GridSearch",
    "RandomSearch",
    "Result",
    "SearchSpace",
    "Suggestion",
    "SyncHalving",
    "TPESampler",
    "TrialRun",
    "TrialRunGroup",
    "TuningAlgorithm",
    "asha",
    "bohb",
    "hyperband",
    "hyperband_brackets",
    "successive_halving",
    "sync_bohb",
]
