"""The torch side of federated training: datasets, models, local training, checkpoints, aggregation."""

from aitbc_agent_sdk.training.aggregation import AggregationStrategy, FedAvg, sample_weights, weighted_average
from aitbc_agent_sdk.training.checkpoint import decode_data, decode_metadata, decode_state, encode_data, encode_state
from aitbc_agent_sdk.training.datasets import DATASET_NAMES, LabeledData, load_dataset, train_test_split
from aitbc_agent_sdk.training.evaluation import EvalResult, evaluate
from aitbc_agent_sdk.training.local import EpochStats, LocalTrainResult, train_local
from aitbc_agent_sdk.training.networks import MODEL_NAMES, build_model, fit_normalization, model_spec_for
from aitbc_agent_sdk.training.clipping import NormClipping
from aitbc_agent_sdk.training.robust import CoordinateMedian, Krum, MultiKrum, TrimmedMean
from aitbc_agent_sdk.training.sharding import dirichlet_partition, iid_partition, label_counts
from aitbc_agent_sdk.training.strategies import STRATEGIES, make_strategy, strategy_for_round

__all__ = [
    "STRATEGIES",
    "CoordinateMedian",
    "Krum",
    "MultiKrum",
    "NormClipping",
    "TrimmedMean",
    "make_strategy", "strategy_for_round",
    "DATASET_NAMES",
    "MODEL_NAMES",
    "AggregationStrategy",
    "EpochStats",
    "EvalResult",
    "FedAvg",
    "LabeledData",
    "LocalTrainResult",
    "build_model",
    "decode_data",
    "decode_metadata",
    "decode_state",
    "dirichlet_partition",
    "encode_data",
    "encode_state",
    "evaluate",
    "fit_normalization",
    "iid_partition",
    "label_counts",
    "load_dataset",
    "model_spec_for",
    "sample_weights",
    "train_local",
    "train_test_split",
    "weighted_average",
]
