"""Orion (EuroSys'24): interference-aware sharing of one GPU between a high-priority (HP) client and
best-effort (BE) clients.

- `listing1`: the per-kernel admission policy of Listing 1 with the ambiguities resolved from the authors'
  scheduler (throttle as an else-branch, `hp_task_running` reset when the HP request's last kernel completes,
  `<=` on the SM check with a same-round accumulator, DUR_THRESHOLD as a fraction of HP latency).
- `profiles`: kernel profiling rules (§4.1: `sm_needed`, compute/memory/unknown classification) and the
  cost-saving formula of §6.2.
- `controller`: bisection controllers, Orion's SM_THRESHOLD search for a training HP job and the node
  agent's BE active-thread percentage `p_be`, with a minimum interval and a hysteresis band.

Pure: no I/O, no clock; time is a parameter.
"""
