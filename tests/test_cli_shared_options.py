"""`distributed-training run` and `init` describe the same training, so they share their options (issue #28):
one declaration (aitbc_cli.spec_options), and here a check on the click commands users get that every option
both take is spelt, typed, ranged, defaulted and explained the same, so that a future drift fails."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
import typer
import typer.main
from typer._click.core import Context

from aitbc_agent_sdk.records import TrainingSpec
from aitbc_cli.app import app, main
from aitbc_cli.spec_options import SHARED_OPTIONS, TrainingOptions, with_training_options

# Differences that are meant: init's --yes starts the devnet, run's spends; init hires 3 workers by default
# (the local devnet's providers), run 4 (its embedded stack starts as many providers as it needs).
OWN_MEANING = {"yes"}
OWN_DEFAULTS = {"target_workers": {"run": 4, "init": 3}}
# What only one of them takes; an option that configures the training belongs in TrainingOptions instead.
RUN_ONLY = {"dataset", "data_path", "label_column", "min_gpu", "providers", "wallet_funds", "dry_run", "plot"}
INIT_ONLY = {"wallet", "dataset_size", "password_file"}


def commands(*names: str) -> dict[str, Any]:
    group = typer.main.get_command(app).get_command(None, "distributed-training")  # type: ignore[attr-defined]
    return {name: group.commands[name] for name in names}


def describe(command: Any, param: Any, *, default: bool = True) -> dict[str, Any]:
    """Everything of an option a user meets: spellings, type, range, metavar, help line, default, checks."""
    ctx = Context(command, info_name=command.name)
    record = param.get_help_record(ctx)
    return {
        "kind": param.param_type_name, "opts": tuple(param.opts), "secondary_opts": tuple(param.secondary_opts),
        "help": param.help, "type": param.bare_type(), "display_type": param.display_type(ctx),
        "min": param.min, "max": param.max, "metavar": param.metavar, "show_default": param.show_default,
        "callback": getattr(param.callback, "__qualname__", param.callback), "multiple": param.multiple,
        "is_flag": param.is_flag, "required": param.required, "hidden": param.hidden, "envvar": param.envvar,
        **({"default": param.default, "help_record": record} if default else {}),
    }


def drift(first: Any, second: Any) -> tuple[set[str], set[str], dict[str, list[str]]]:
    """(only in FIRST, only in SECOND, {option both take: the properties that differ})."""
    ones = {p.name: p for p in first.params}
    twos = {p.name: p for p in second.params}
    differing = {}
    for name in ones.keys() & twos.keys():
        check_default = name not in OWN_DEFAULTS
        one = describe(first, ones[name], default=check_default)
        two = describe(second, twos[name], default=check_default)
        if one != two:
            differing[name] = sorted(k for k in one if one[k] != two[k])
    return set(ones) - set(twos), set(twos) - set(ones), differing


def test_run_and_init_take_the_shared_options_alike() -> None:
    cmds = commands("run", "init")
    only_run, only_init, differing = drift(cmds["run"], cmds["init"])
    assert {n: d for n, d in differing.items() if n not in OWN_MEANING} == {}
    assert set(differing) <= OWN_MEANING
    assert only_run == RUN_ONLY, "an option on run only: declare it in TrainingOptions if init needs it too"
    assert only_init == INIT_ONLY, "an option on init only: declare it in TrainingOptions if run needs it too"
    both = {p.name for p in cmds["run"].params} & {p.name for p in cmds["init"].params}
    assert set(SHARED_OPTIONS) <= both
    assert len(SHARED_OPTIONS) > 30 and len(both - OWN_MEANING) > 30  # the whole training, not a handful
    for name, defaults in OWN_DEFAULTS.items():
        for command, default in defaults.items():
            assert {p.name: p for p in cmds[command].params}[name].default == default, (command, name)


def test_every_shared_option_has_help_and_both_commands_an_example() -> None:
    for command in commands("run", "init").values():
        assert "Example: aitbc distributed-training " + command.name in command.help
        for param in command.params:
            if param.name in SHARED_OPTIONS:
                assert param.help and param.help.strip(), (command.name, param.name)


def test_the_check_sees_a_drift() -> None:
    """The comparison above fails on what happened before: --alpha with a range on one command only."""
    pair = typer.Typer()

    @pair.command()
    def one(alpha: Annotated[float, typer.Option(help="Dirichlet concentration")] = 0.5,
            seed: Annotated[int, typer.Option(help="seed")] = 0, extra: bool = False) -> None: ...

    @pair.command()
    def two(alpha: Annotated[float, typer.Option(min=1e-6, help="Dirichlet concentration")] = 0.5,
            seed: Annotated[int, typer.Option(help="the seed")] = 1) -> None: ...

    group = typer.main.get_command(pair)
    only_one, only_two, differing = drift(group.commands["one"], group.commands["two"])  # type: ignore[attr-defined]
    assert (only_one, only_two) == ({"extra"}, set())
    assert set(differing) == {"alpha", "seed"}
    assert "min" in differing["alpha"] and {"help", "default"} <= set(differing["seed"])


def test_a_command_cannot_declare_a_shared_option_again() -> None:
    with pytest.raises(TypeError, match="alpha"):
        @with_training_options()
        def again(options: TrainingOptions = TrainingOptions(), alpha: float = 0.5) -> None: ...
    with pytest.raises(TypeError, match="not a shared option"):
        with_training_options(wallet="dev")


def test_the_shared_defaults_are_the_sdks() -> None:
    spec, default = TrainingOptions().spec(), TrainingSpec(model_type="mlp", target_workers=4)
    assert spec.model_dump(exclude={"rounds"}) == default.model_dump(exclude={"rounds"})


@pytest.mark.parametrize("command", [["run"], ["init", "--wallet", "dev"]])
def test_alpha_above_0_on_both_commands(command: list[str], aitbc_home: Any,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """TrainingSpec wants alpha > 0: both refuse 0 as a usage error naming the flag (run used to fail later, in
    the SDK's validation; init refused 1e-7, which the SDK takes)."""
    with pytest.raises(SystemExit) as done:
        main(["distributed-training", *command, "--alpha", "0", "--json"])
    assert done.value.code == 2
    assert "--alpha" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["run", "init"])
def test_help_lists_every_shared_option(command: str, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as done:
        main(["distributed-training", command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "Example: aitbc distributed-training " + command in out
    params = {p.name: p for p in commands(command)[command].params}
    for name in SHARED_OPTIONS:
        assert params[name].opts[0] in out, name
