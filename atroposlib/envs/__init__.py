"""Environments: the `BaseEnv` framework that produces scored groups of rollouts."""
