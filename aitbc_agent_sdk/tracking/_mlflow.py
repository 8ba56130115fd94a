"""MLflow: one run per training in the ``aitbc`` experiment, through the tracking client.

The tracking server is ``MLFLOW_TRACKING_URI`` when set, else a file store under the training's ``mlruns/``
(``mlflow ui --backend-store-uri`` that directory to look at it).
"""

from __future__ import annotations

import os
import time
from typing import Mapping

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from ._port import ExperimentRun

EXPERIMENT = "aitbc"
MAX_PARAM_CHARS = 500  # MLflow refuses longer parameter values


class MlflowLog:
    def __init__(self, run: ExperimentRun) -> None:
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run.directory / "mlruns").resolve().as_uri()
        self._client = MlflowClient(tracking_uri=uri)
        found = self._client.get_experiment_by_name(EXPERIMENT)
        experiment = found.experiment_id if found else self._client.create_experiment(EXPERIMENT)
        # A resumed training carries on in its run (the id is [A-Za-z0-9_-], safe inside the quotes).
        earlier = self._client.search_runs([experiment], f"tags.`aitbc.training_id` = '{run.training_id}'",
                                           max_results=1)
        self._run_id = earlier[0].info.run_id if earlier else self._client.create_run(
            experiment, run_name=run.training_id, tags={"aitbc.training_id": run.training_id}).info.run_id
        params = [Param(key, str(value)[:MAX_PARAM_CHARS]) for key, value in sorted(run.config.items())]
        for start in range(0, len(params), 100):  # log_batch takes at most 100 parameters a call
            self._client.log_batch(self._run_id, params=params[start:start + 100])

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = [Metric(tag, float(value), now, step) for tag, value in scalars.items()]
        for start in range(0, len(metrics), 1000):  # and at most 1000 metrics
            self._client.log_batch(self._run_id, metrics=metrics[start:start + 1000])

    def close(self) -> None:
        self._client.set_terminated(self._run_id)
