"""The bundled Table 3 zoo (Symphony Appendix C) against the paper's own statements about it."""

from __future__ import annotations

from pathlib import Path

import pytest
from tessera.sim.serving.cluster_sim import staggered_batch
from tessera.sim.serving.zoo import load_zoo, symphony_zoo


def test_zoo_is_table3() -> None:
    zoo = load_zoo()
    models = symphony_zoo()
    assert len(models) == 35  # "A mixed-model setup contains 35 different models" [S:L209]
    ratios = [m.profile.beta / m.profile.alpha for m in models]
    assert ratios == sorted(ratios, reverse=True)  # Table 3 is ordered by β/α
    assert ratios[0] == pytest.approx(25.172, abs=1e-3) and ratios[-1] == pytest.approx(0.023, abs=1e-3)
    for m in zoo.models:
        # The SLO lets every model run batches of at least 4 [S:L540]: max(20 ms, 2ℓ(4)) within 1 ms (E.3.2).
        assert abs(m.slo_ms - max(20.0, 2 * (4 * m.alpha_ms + m.beta_ms))) <= 1.0, m.name
    assert all(staggered_batch(m, 35) >= 4 for m in models)


def test_zoo_file_errors_are_reported(tmp_path: Path) -> None:
    bad = tmp_path / "z.yaml"
    bad.write_text(
        "name: z\nsource: s\nmax_batch: 8\nmodels: [{name: a, alpha_ms: -1, beta_ms: 1, slo_ms: 5}]\n"
    )
    with pytest.raises(ValueError, match="alpha_ms"):
        load_zoo(bad)
