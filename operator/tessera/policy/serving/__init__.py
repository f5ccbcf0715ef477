"""Serving policies: Orloj (distribution-aware batching for dynamic models), Symphony (deferred batch
scheduling across GPUs), their batching baselines, and AlpaServe placement. Shared types live in
:mod:`tessera.policy.serving.common`."""
