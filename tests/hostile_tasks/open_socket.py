"""Hostile task: connect to services on the provider's host (the MQTT broker, the IPFS API) from the sandbox."""

from __future__ import annotations

import socket

from torch import nn

from aitbc_agent_sdk import DataInfo, TaskParams, TrainingTask


class SocketParams(TaskParams):
    ports: tuple[int, ...] = ()  # on 127.0.0.1


class OpenSocket(TrainingTask):
    name = "hostile-open-socket"
    Params = SocketParams

    def build_model(self, info: DataInfo, params: TaskParams) -> nn.Module:
        assert isinstance(params, SocketParams)
        reached, errors = [], []
        for port in params.ports:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
                reached.append(port)
            except OSError as exc:
                errors.append(exc)
        if reached:
            raise RuntimeError(f"reached 127.0.0.1 ports {reached}")
        raise errors[0]
