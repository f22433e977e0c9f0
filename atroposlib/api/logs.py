"""Logging set-up of the API server: readable lines, or one JSON object per line."""

from __future__ import annotations

import logging
import time

import orjson


class JsonLineFormatter(logging.Formatter):
    """Formats a record as one JSON object: time, level, logger, message (+ exception)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def configure_logging(level: str, as_json: bool) -> dict:
    """Configure the root logger and return a uvicorn ``log_config`` that matches it."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonLineFormatter() if as_json else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    return {"version": 1, "disable_existing_loggers": False,
            "loggers": {"uvicorn": {"level": level.upper()}, "uvicorn.access": {"level": level.upper()}}}
