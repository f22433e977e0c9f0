"""Fixtures of the environment tests: offline hubs, and the scripted inference server's pieces."""

from tests.environments.harness import _offline  # noqa: F401 (autouse fixture)
