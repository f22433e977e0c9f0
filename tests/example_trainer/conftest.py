"""The trainer's tests share the real-engine fixtures of tests/local: the prepared bundled
model and the offline GSM8K-style data."""

from tests.local.conftest import gsm8k_data, installed_runtime, real_model_dir

__all__ = ["gsm8k_data", "installed_runtime", "real_model_dir"]
