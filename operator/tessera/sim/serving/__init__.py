"""Serving simulator: request arrivals, queues, batch formation and GPU workers driven by the
serving policies in :mod:`tessera.policy.serving`."""
