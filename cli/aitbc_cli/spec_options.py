"""The options ``distributed-training run`` and ``init`` share, declared once.

Both commands describe the same training (model, task, rounds, data split, aggregation, the fault policy's
timeouts, the elastic pool, the bond asked of providers), and they used to list these ~36 options each in their
own signature, where they drifted apart (``--alpha`` had a range on ``init`` only, and another help text).
Here they are one record, :class:`TrainingOptions`; a command takes it as one parameter and
:func:`with_training_options` puts the record's fields in its place in the command's signature, so typer shows
and parses them as before, in this order, and the command receives the record, whose :meth:`~TrainingOptions.spec`
builds the :class:`TrainingSpec` the same way for both. tests/test_cli_shared_options.py keeps the two equal.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, fields
from typing import Any, Callable, Optional, get_type_hints

from aitbc_agent_sdk.records import FaultPolicy, JobConfig, TrainingSpec

from .common import (
    EncryptOption, HeartbeatOption, MaxWorkersOption, MinWorkersOption, ScaleWindowOption, SparesOption,
    TargetThroughputOption, elastic_policy,
)
from .task_options import TaskOption, TaskParamOption
from .training_options import (
    FAULTS, JOB, SPEC, AggregationChoiceOption, AlphaOption, AssumedSpeedOption, BatchSizeOption, EpochsOption,
    FetchTimeoutOption, FirstRoundDeadlineOption, LrOption, MinDeadlineOption, MinRoundTimeoutOption,
    StragglerMinOption, MinStakeOption, ModelType, ModelTypeOption, OpeningTimeoutOption, OuterLrOption,
    OuterMomentumOption, OuterOption, PartitionOption, PingTimeoutOption, ResendTimeoutOption, RoundsOption,
    RoundTimeoutOption, SeedOption, SpotChecksOption, TargetOption, TargetWorkersOption, UpdateEncodingOption,
    VerifyOnOption, VerifyTimeoutOption, CanaryRateOption, VocabSizeOption, LogToOption, log_to_names,
)


def _value(choice: Any) -> Any:
    """An enum member's value (typer passes members; a default given as text passes as it is)."""
    return getattr(choice, "value", choice)


@dataclass(frozen=True)
class TrainingOptions:
    """What ``run`` and ``init`` both ask about the training; each field is one option, in --help's order."""

    target: TargetOption = None
    vocab_size: VocabSizeOption = None
    model_type: ModelTypeOption = ModelType.mlp
    task: TaskOption = None
    task_param: TaskParamOption = None
    target_workers: TargetWorkersOption = 4  # init asks for 3, the devnet's providers (see steps.init)
    rounds: RoundsOption = 5
    epochs: EpochsOption = JOB["epochs"].default
    batch_size: BatchSizeOption = JOB["batch_size"].default
    lr: LrOption = JOB["learning_rate"].default
    partition: PartitionOption = "iid"
    alpha: AlphaOption = SPEC["dirichlet_alpha"].default
    seed: SeedOption = 0
    spares: SparesOption = 0
    encrypt: EncryptOption = False
    aggregation: AggregationChoiceOption = "fedavg"
    outer: OuterOption = "fedavg"
    outer_lr: OuterLrOption = SPEC["outer_lr"].default
    outer_momentum: OuterMomentumOption = SPEC["outer_momentum"].default
    update_encoding: UpdateEncodingOption = None
    heartbeat_timeout: HeartbeatOption = FAULTS["heartbeat_timeout_s"].default
    ping_timeout: PingTimeoutOption = FAULTS["ping_timeout_s"].default
    first_round_deadline: FirstRoundDeadlineOption = FAULTS["first_round_deadline_s"].default
    assumed_samples_per_s: AssumedSpeedOption = FAULTS["assumed_samples_per_s"].default
    min_deadline: MinDeadlineOption = FAULTS["min_deadline_s"].default
    straggler_min: StragglerMinOption = FAULTS["straggler_min_s"].default
    round_timeout: RoundTimeoutOption = None
    min_round_timeout: MinRoundTimeoutOption = FAULTS["min_round_timeout_s"].default
    fetch_timeout: FetchTimeoutOption = FAULTS["fetch_timeout_s"].default
    resend_timeout: ResendTimeoutOption = FAULTS["resend_timeout_s"].default
    spot_checks: SpotChecksOption = FAULTS["spot_checks"].default
    opening_timeout: OpeningTimeoutOption = FAULTS["opening_timeout_s"].default
    verify_on: VerifyOnOption = FAULTS["verify_on"].default
    verify_timeout: VerifyTimeoutOption = FAULTS["verify_timeout_s"].default
    canary_rate: CanaryRateOption = FAULTS["canary_rate"].default
    target_throughput: TargetThroughputOption = None
    min_workers: MinWorkersOption = 1
    max_workers: MaxWorkersOption = 64
    scale_window: ScaleWindowOption = 2
    min_stake: MinStakeOption = None
    log_to: LogToOption = None

    @property
    def target_kind(self) -> Optional[str]:
        return _value(self.target)  # type: ignore[no-any-return]

    def spec(self, **extra: Any) -> TrainingSpec:
        """The training these options describe; EXTRA: fields only one command has (init's dataset_size)."""
        return TrainingSpec(
            model_type=ModelType(self.model_type).value, target_workers=self.target_workers, rounds=self.rounds,
            partition=_value(self.partition), dirichlet_alpha=self.alpha, seed=self.seed,
            target=self.target_kind, vocab_size=self.vocab_size, spare_workers=self.spares, encrypt=self.encrypt,
            min_stake_wei=self.min_stake, outer=_value(self.outer), outer_lr=self.outer_lr,
            outer_momentum=self.outer_momentum, update_encoding=_value(self.update_encoding),
            aggregation=_value(self.aggregation), log_to=log_to_names(self.log_to),
            faults=FaultPolicy(
                heartbeat_timeout_s=self.heartbeat_timeout, ping_timeout_s=self.ping_timeout,
                first_round_deadline_s=self.first_round_deadline, assumed_samples_per_s=self.assumed_samples_per_s,
                min_deadline_s=self.min_deadline, straggler_min_s=self.straggler_min,
                round_timeout_s=self.round_timeout,
                min_round_timeout_s=self.min_round_timeout, fetch_timeout_s=self.fetch_timeout,
                resend_timeout_s=self.resend_timeout, spot_checks=self.spot_checks,
                opening_timeout_s=self.opening_timeout, verify_on=_value(self.verify_on),
                verify_timeout_s=self.verify_timeout, canary_rate=self.canary_rate),
            elastic=elastic_policy(self.target_throughput, self.min_workers, self.max_workers, self.scale_window),
            job=JobConfig(batch_size=self.batch_size, learning_rate=self.lr, epochs=self.epochs),
            **extra)


SHARED_OPTIONS: tuple[str, ...] = tuple(f.name for f in fields(TrainingOptions))
_HINTS = get_type_hints(TrainingOptions, include_extras=True)  # the Annotated[..., typer.Option] of each field

Command = Callable[..., None]


def with_training_options(**defaults: Any) -> Callable[[Command], Command]:
    """Give COMMAND the shared options in place of its one ``TrainingOptions`` parameter.

    DEFAULTS overrides a field's default for this command only (init: ``target_workers=3``); the option's
    spelling, range and help stay the shared ones."""
    unknown = set(defaults) - set(SHARED_OPTIONS)
    if unknown:
        raise TypeError(f"not a shared option: {', '.join(sorted(unknown))}")

    def decorate(command: Command) -> Command:
        signature = inspect.signature(command, eval_str=True)
        own = list(signature.parameters.values())
        slots = [i for i, p in enumerate(own) if p.annotation is TrainingOptions]
        if len(slots) != 1:
            raise TypeError(f"{command.__name__} must take exactly one TrainingOptions parameter")
        slot = slots[0]
        record = own[slot].name
        clash = set(SHARED_OPTIONS) & {p.name for p in own}
        if clash:
            raise TypeError(f"{command.__name__} declares shared options itself: {', '.join(sorted(clash))}")
        shared = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=_HINTS[f.name],
                                    default=defaults.get(f.name, f.default)) for f in fields(TrainingOptions)]
        # typer passes every option by keyword: keyword-only lets an option without a default follow one with
        parameters = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in (*own[:slot], *shared, *own[slot + 1:])]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> None:
            options = TrainingOptions(**{name: kwargs.pop(name) for name in SHARED_OPTIONS})
            command(**kwargs, **{record: options})

        wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": None}
        return wrapper

    return decorate
