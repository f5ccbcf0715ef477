"""Fluid: TrialGroup water-filling (Fluid, in Peifeng Yu's PhD dissertation ch. 3).

StaticFluid widths for a new TrialGroup, DynamicFluid re-planning when resources free up or change,
the Eq. 3.2 runtime model, Eq. 3.1 packing-degree choice, and placement onto concrete GPUs.
"""

from tessera.policy.fluid.bounds import d_binds, static_bound
from tessera.policy.fluid.config import FluidConfig
from tessera.policy.fluid.packing_benefit import (
    DEFAULT_THRESHOLD,
    choose_packing_degree,
    iter_times_from_alpha,
    marginal_benefits,
)
from tessera.policy.fluid.placement import (
    PackedLane,
    TrialDemand,
    TrialGroupPlacement,
    choose_gang,
    place,
    plan_trial_group,
)
from tessera.policy.fluid.runtime_model import RuntimeModel
from tessera.policy.fluid.water_filling import (
    Rescale,
    Rule,
    dynamic_rescale,
    plan_makespan,
    planning_order,
    rescale_rule,
    static_widths,
    water_fill,
)

__all__ = [
    "DEFAULT_THRESHOLD",
    "FluidConfig",
    "PackedLane",
    "Rescale",
    "Rule",
    "RuntimeModel",
    "TrialDemand",
    "TrialGroupPlacement",
    "choose_gang",
    "choose_packing_degree",
    "d_binds",
    "dynamic_rescale",
    "iter_times_from_alpha",
    "marginal_benefits",
    "place",
    "plan_makespan",
    "plan_trial_group",
    "planning_order",
    "rescale_rule",
    "static_bound",
    "static_widths",
    "water_fill",
]
