"""`tessera operator` flags for the Themis arbiter reach the Themis instance the operator runs."""

import pytest
from tessera import cli
from tessera.commands.operator import config_from_args
from tessera.controller.arbiter import Arbiter
from tessera.controller.config import OperatorConfig
from tessera.controller.context import Context


def test_themis_flags_reach_the_arbiter() -> None:
    argv = ["operator", "--lease-seconds", "300", "--fairness-knob", "0.5", "--starving-rank", "cap"]
    config = config_from_args(cli.build_parser().parse_args([*argv, "--no-renew-in-place"]))
    arbiter = Arbiter(Context(config, None, None, None, None))  # type: ignore[arg-type]  # only the config is read here
    themis = arbiter.themis.config
    assert (themis.lease_s, themis.fairness_knob, themis.starving_rank) == (300.0, 0.5, "cap")
    assert themis.renew_in_place is False
    defaults = config_from_args(cli.build_parser().parse_args(["operator"]))
    default = Arbiter(Context(defaults, None, None, None, None))  # type: ignore[arg-type]
    assert default.themis.config.starving_rank == "fair_share"
    assert default.themis.config.renew_in_place is True


def test_bad_starving_rank_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["operator", "--starving-rank", "fifo"])
    assert "invalid choice: 'fifo'" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"starving_rank\n.*'fair_share' or 'cap'"):
        OperatorConfig(starving_rank="fifo")


def test_peering_lifetime_flag_and_its_bound() -> None:
    argv = ["operator", "--peering", "p", "--priority", "7", "--peering-lifetime-seconds", "15"]
    config = config_from_args(cli.build_parser().parse_args(argv))
    assert (config.peering_name, config.priority, config.peering_lifetime_s) == ("p", 7, 15)
    assert config_from_args(cli.build_parser().parse_args(["operator"])).peering_lifetime_s == 60  # kopf's
    with pytest.raises(ValueError, match=r"peering_lifetime_s\n.*greater than or equal to 1"):
        OperatorConfig(peering_lifetime_s=0)


def test_pass_deadline_flag_reaches_the_liveness_probe() -> None:
    argv = ["operator", "--lease-seconds", "30", "--pass-deadline-seconds", "90"]
    assert config_from_args(cli.build_parser().parse_args(argv)).pass_deadline == 90.0
    # Unset: one lease period, never under a minute.
    assert config_from_args(cli.build_parser().parse_args(argv[:3])).pass_deadline == 60.0
    assert OperatorConfig(lease_s=600.0).pass_deadline == 600.0
    with pytest.raises(ValueError, match=r"pass_deadline_s\n.*greater than 0"):
        OperatorConfig(pass_deadline_s=0.0)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--lease-seconds", "0"], "--lease-seconds (lease_s): must be > 0"),
        (["--fairness-knob", "1.5"], "--fairness-knob (fairness_knob): must be <= 1"),
        (["--lease-seconds", "nan"], "--lease-seconds (lease_s): must be a finite number"),
        (["--socket-group", "-1"], "--socket-group (socket_group): must be >= 0"),
        (
            ["--seed", "-1", "--peering-lifetime-seconds", "0"],
            "--seed (seed): must be >= 0; --peering-lifetime-seconds (peering_lifetime_s): must be >= 1",
        ),
    ],
)
def test_a_refused_flag_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    assert cli.main(["operator", *argv]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"tessera operator: {line}\n")
