"""Rendering rollouts for people: JSONL to HTML reports."""
