"""Printing evaluation results as an lm-eval style Markdown table."""

from __future__ import annotations

from typing import Any

COLUMNS = ["Groups", "Version", "Filter", "n-shot", "Metric", "", "Value", "", "Stderr"]


def _row(task_name: str, key: str, value: Any) -> list[str]:
    metric = key.replace("eval/", "", 1).replace("_", " ")
    direction = "↑" if "correct" in key or "acc" in key else ""
    shown = f"{value:.4f}" if isinstance(value, (int, float)) else str(value)
    return [task_name, "1", "none", "", metric, direction, shown, "±", "0.0000"]


def display_metrics_table(task_name: str, metrics: dict[str, Any], start_time: float, end_time: float) -> None:
    rows = [_row(task_name, key, value) for key, value in metrics.items()]
    widths = [max(len(COLUMNS[i]), *(len(r[i]) for r in rows)) if rows else len(COLUMNS[i]) for i in range(len(COLUMNS))]

    def line(cells: list[str]) -> str:
        return "|" + "|".join(f"{cell:<{widths[i]}}" for i, cell in enumerate(cells)) + "|"

    separator = ["-" * w if i not in (6, 8) else "-" * (w - 1) + ":" for i, w in enumerate(widths)]
    print()
    print(f"Evaluation Results: {task_name}")
    print(line(COLUMNS))
    print("|" + "|".join(separator) + "|")
    for row in rows:
        print(line(row))
    print(f"Evaluation completed in {end_time - start_time:.2f} seconds")
