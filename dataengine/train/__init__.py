"""Training with TRL: offline DPO, rejection-sampling SFT and online GRPO with tools.

Each trainer is a config section (dataengine.config: TrainConfig and one subclass per trainer) plus a plain function (callable without Prefect) that writes
a checkpoint folder loadable with dataengine.models.load_model(path) and, given a store,
registers it in the models table with its parent and the dataset versions it used.
Heavy libraries (torch, TRL) are imported inside the functions.
"""

from dataengine.config import TrainConfig
from dataengine.train.chain import train_chain
from dataengine.train.checkpoint import (
    CheckpointInfo,
    read_checkpoint_info,
    register_checkpoint,
)
from dataengine.train.data import TrainingData, TrainingDataError, load_training_data
from dataengine.train.dpo import DPOTrainConfig, train_dpo
from dataengine.train.grpo import GRPOTrainConfig, train_grpo
from dataengine.train.sft import SFTTrainConfig, train_sft

__all__ = [
    "CheckpointInfo",
    "DPOTrainConfig",
    "GRPOTrainConfig",
    "SFTTrainConfig",
    "TrainConfig",
    "TrainingData",
    "TrainingDataError",
    "load_training_data",
    "read_checkpoint_info",
    "register_checkpoint",
    "train_chain",
    "train_dpo",
    "train_grpo",
    "train_sft",
]
