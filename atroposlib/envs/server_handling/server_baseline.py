"""Configuration and base classes of inference servers (Atropos's module of this name)."""

from atroposlib.envs.server_handling.api_server import APIServer
from atroposlib.envs.server_handling.configs import APIServerConfig, ServerBaseline
from atroposlib.envs.server_handling.reasoning import ReasoningConfig
from atroposlib.envs.server_handling.semaphore import AsyncSemWithAdaptiveWeight

__all__ = ["APIServer", "APIServerConfig", "AsyncSemWithAdaptiveWeight", "ReasoningConfig", "ServerBaseline"]
