"""An on-disk FIFO of submissions the trajectory API could not take yet.

Each payload is one file, written to a temporary name, fsynced and renamed, so a crash
never leaves half a payload; files are named by sequence so they replay in order.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator


class Spool:
    """Payloads waiting to be re-sent: ``(endpoint, body)`` pairs in arrival order."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        existing = [int(p.name.split(".", 1)[0]) for p in folder.glob("*.json")]
        self._next = max(existing, default=0) + 1

    def append(self, endpoint: str, body: bytes) -> Path:
        name = f"{self._next:012d}.{endpoint.strip('/').replace('/', '_')}.json"
        self._next += 1
        temporary = self.folder / f".{name}.tmp"
        with open(temporary, "wb") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        target = self.folder / name
        os.replace(temporary, target)
        return target

    def pending(self) -> Iterator[tuple[Path, str, bytes]]:
        """(file, endpoint, body) of every spooled payload, oldest first."""
        for path in sorted(self.folder.glob("*.json")):
            endpoint = "/" + path.name.split(".", 2)[1]
            yield path, endpoint, path.read_bytes()

    def __len__(self) -> int:
        return sum(1 for _ in self.folder.glob("*.json"))

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.folder.glob("*.json"))
