"""The forecasting pipeline: `Forecaster` and its settings.

This package and the CLI on top of it are the only parts of `tft_jax` that
import `qat`.
"""

from tft_jax.forecaster.config import (
    DEMO,
    DataConfig,
    ForecasterConfig,
    ModelConfig,
    QATTrainingConfig,
    TrainingConfig,
)
from tft_jax.forecaster.forecaster import Forecaster, quantile_name
from tft_jax.forecaster.run_folder import RunFolderError

__all__ = [
    "DEMO",
    "DataConfig",
    "Forecaster",
    "ForecasterConfig",
    "ModelConfig",
    "QATTrainingConfig",
    "RunFolderError",
    "TrainingConfig",
    "quantile_name",
]
