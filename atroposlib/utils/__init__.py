"""Helpers shared by environments and tools (tokenisation for trainers, advantages, ...)."""
