"""Baseline training policies behind the same interface as Themis (Themis (Mahajan et al., NSDI'20) §6.1)."""

from tessera.policy.baselines.drf import Drf
from tessera.policy.baselines.gandiva import Gandiva
from tessera.policy.baselines.greedy import GreedyPolicy
from tessera.policy.baselines.optimus import Optimus
from tessera.policy.baselines.slaq import Slaq
from tessera.policy.baselines.srsf import Srsf
from tessera.policy.baselines.srtf import Srtf
from tessera.policy.baselines.tiresias import Tiresias

BASELINES: dict[str, type[GreedyPolicy]] = {
    p.name: p for p in (Tiresias, Gandiva, Optimus, Slaq, Srtf, Srsf, Drf)
}

__all__ = ["BASELINES", "Drf", "Gandiva", "GreedyPolicy", "Optimus", "Slaq", "Srsf", "Srtf", "Tiresias"]
