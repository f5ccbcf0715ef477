"""`tessera operator` flags for the Themis arbiter reach the Themis instance the operator runs."""

import pytest
from tessera import cli
from tessera.commands.operator import config_from_args
from tessera.controller.arbiter import Arbiter
from tessera.controller.config import OperatorConfig
from tessera.controller.context import Context


def test_themis_flags_reach_the_arbiter() -> None:
    argv = ["operator", "--lease-seconds", "300", "--fairness-knob", "0.5", "--starving-rank", "cap"]
    config = config_from_args(cli.build_parser().parse_args(argv))
    arbiter = Arbiter(Context(config, None, None, None, None))  # type: ignore[arg-type]  # only the config is read here
    themis = arbiter.themis.config
    assert (themis.lease_s, themis.fairness_knob, themis.starving_rank) == (300.0, 0.5, "cap")
    defaults = config_from_args(cli.build_parser().parse_args(["operator"]))
    default = Arbiter(Context(defaults, None, None, None, None))  # type: ignore[arg-type]
    assert default.themis.config.starving_rank == "fair_share"


def test_bad_starving_rank_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["operator", "--starving-rank", "fifo"])
    assert "invalid choice: 'fifo'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="starving rank must be 'fair_share' or 'cap'"):
        OperatorConfig(starving_rank="fifo")


def test_peering_lifetime_flag_and_its_bound() -> None:
    argv = ["operator", "--peering", "p", "--priority", "7", "--peering-lifetime-seconds", "15"]
    config = config_from_args(cli.build_parser().parse_args(argv))
    assert (config.peering_name, config.priority, config.peering_lifetime_s) == ("p", 7, 15)
    assert config_from_args(cli.build_parser().parse_args(["operator"])).peering_lifetime_s == 60  # kopf's
    with pytest.raises(ValueError, match="peering lifetime must be >= 1 second"):
        OperatorConfig(peering_lifetime_s=0)


def test_pass_deadline_flag_reaches_the_liveness_probe() -> None:
    argv = ["operator", "--lease-seconds", "30", "--pass-deadline-seconds", "90"]
    assert config_from_args(cli.build_parser().parse_args(argv)).pass_deadline == 90.0
    # Unset: one lease period, never under a minute.
    assert config_from_args(cli.build_parser().parse_args(argv[:3])).pass_deadline == 60.0
    assert OperatorConfig(lease_s=600.0).pass_deadline == 600.0
    with pytest.raises(ValueError, match="pass deadline must be positive"):
        OperatorConfig(pass_deadline_s=0.0)
