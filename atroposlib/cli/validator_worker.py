"""Entry point of a validator worker process (started by the API server, not by users).

Usage: ``python -m atroposlib.cli.validator_worker FD LEVEL MAX_DECOMPRESSED_BYTES``.
"""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection

from atroposlib.api.validator_pool import serve_validation

if __name__ == "__main__":
    serve_validation(Connection(int(sys.argv[1])), sys.argv[2], int(sys.argv[3]))
