"""Trajectory API throughput: this project vs atroposlib 0.4.0 vs do-nothing servers.

Many concurrent clients post gzip-compressed scored groups (8 sequences of ~1,024
tokens), then one consumer drains every batch, then both run together. Every group
carries a unique id; the run fails if any acknowledged group is lost or served twice.
Two do-nothing servers (``bench/do_nothing_server.py``) give the ingest ceilings: a
bare ASGI app parsing with orjson, and a FastAPI app parsing with ``request.json()``.

    python bench/api_throughput.py [--groups 1600] [--clients 32] [--rounds 3] [--uncompressed]
        [--reference-python /opt/refvenv/bin/python]

The reference runs from its own virtual environment (``bench/setup_reference.sh``).
Every server runs on this machine with the load generator, one after another, in
interleaved rounds; the table shows medians. Compare ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parent.parent
SEQUENCES, TOKENS, PROMPT = 8, 1024, 256
BATCH_SIZE = 64  # sequences: 8 groups per batch
GZIP_MAGIC = b"\x1f\x8b"
DEFAULT_REFERENCE_PYTHON = os.environ.get("ATROPOS_REFERENCE_PYTHON", "/opt/refvenv/bin/python")


def make_bodies(count: int, first_id: int, seed: int, compress: bool = True) -> list[bytes]:
    """Scored groups as JSON bodies, gzip-compressed when `compress`; scores[0] of group k
    is its unique id."""
    rng = random.Random(seed)
    pool = [[rng.randrange(100, 32000) for _ in range(TOKENS)] for _ in range(32)]
    bodies = []
    for k in range(count):
        tokens = [pool[(k + s) % len(pool)] for s in range(SEQUENCES)]
        masks = [[-100] * PROMPT + seq[PROMPT:] for seq in tokens]
        scores = [float(first_id + k)] + [rng.random() for _ in range(SEQUENCES - 1)]
        body = orjson.dumps({"tokens": tokens, "masks": masks, "scores": scores, "env_id": 0})
        bodies.append(gzip.compress(body, compresslevel=6) if compress else body)
    return bodies


@dataclass
class Server:
    name: str
    argv: list[str]
    port: int
    process: Optional[subprocess.Popen] = None
    log: Optional[Path] = None
    serves_batches: bool = True
    in_project: bool = True  # False: run outside the checkout so its imports are not shadowed

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, workdir: Path) -> None:
        self.log = workdir / f"{self.name}.log"
        self.process = subprocess.Popen(self.argv, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT,
                                        cwd=ROOT if self.in_project else workdir)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-2000:]}")
            try:
                import urllib.request
                urllib.request.urlopen(self.url + "/", timeout=1)
                return
            except Exception:
                time.sleep(0.2)
        raise TimeoutError(f"{self.name} did not start")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()


@dataclass
class Result:
    ingest: float = 0.0
    drain: float = 0.0
    mixed: float = 0.0
    acknowledged: set[int] = field(default_factory=set)
    served: list[int] = field(default_factory=list)


async def post_all(session: aiohttp.ClientSession, url: str, bodies: list[bytes], first_id: int,
                   clients: int, acknowledged: set[int]) -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for k in range(len(bodies)):
        queue.put_nowait(k)
    headers = {"Content-Type": "application/json"}
    if bodies and bodies[0][:2] == GZIP_MAGIC:
        headers["Content-Encoding"] = "gzip"

    async def worker() -> None:
        while not queue.empty():
            k = queue.get_nowait()
            async with session.post(url + "/scored_data", data=bodies[k], headers=headers) as response:
                await response.read()
                if response.status == 200:
                    acknowledged.add(first_id + k)

    await asyncio.gather(*(worker() for _ in range(clients)))


async def drain(session: aiohttp.ClientSession, url: str, served: list[int], until: int,
                producers_done: Optional[asyncio.Event] = None) -> None:
    """Pop batches until `until` groups were served or no batch is left; while producers
    are still posting (`producers_done` given and not set), wait for more instead."""
    while len(served) < until:
        async with session.get(url + "/batch", headers={"Accept-Encoding": "gzip"}) as response:
            batch = orjson.loads(await response.read()).get("batch")
        if batch:
            served.extend(int(item["scores"][0]) for item in batch)
        elif producers_done is not None and not producers_done.is_set():
            await asyncio.sleep(0.005)
        else:
            return


async def run_server(server: Server, ingest_bodies: list[bytes], mixed_bodies: list[bytes], clients: int) -> Result:
    result = Result()
    connector = aiohttp.TCPConnector(limit=clients + 2)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=True) as session:
        registration = {"wandb_group": "bench", "wandb_project": "bench", "batch_size": BATCH_SIZE,
                        "max_token_len": 4096, "checkpoint_dir": "ckpt", "save_checkpoint_interval": 100,
                        "starting_step": 0, "num_steps": 10**6}
        await (await session.post(server.url + "/register", json=registration)).read()
        await (await session.get(server.url + "/batch")).read()
        env = {"max_token_length": 4096, "desired_name": "bench", "weight": 1.0, "group_size": SEQUENCES}
        await (await session.post(server.url + "/register-env", json=env)).read()

        started = time.perf_counter()
        await post_all(session, server.url, ingest_bodies, 0, clients, result.acknowledged)
        result.ingest = len(ingest_bodies) / (time.perf_counter() - started)
        if not server.serves_batches:
            return result

        started = time.perf_counter()
        await drain(session, server.url, result.served, len(result.acknowledged))
        result.drain = len(result.served) / (time.perf_counter() - started)

        first_id = len(ingest_bodies)
        target = len(result.served) + len(mixed_bodies)
        stop = asyncio.Event()
        started = time.perf_counter()

        async def produce() -> None:
            await post_all(session, server.url, mixed_bodies, first_id, clients, result.acknowledged)
            stop.set()

        await asyncio.gather(produce(), drain(session, server.url, result.served, target, stop))
        await drain(session, server.url, result.served, target)
        result.mixed = len(mixed_bodies) / (time.perf_counter() - started)
    return result


def check_delivery(name: str, result: Result) -> None:
    duplicates = len(result.served) - len(set(result.served))
    lost = result.acknowledged - set(result.served)
    if duplicates or lost:
        raise SystemExit(f"{name}: {len(lost)} acknowledged groups lost, {duplicates} served twice")


def make_servers(workdir: Path, reference_python: str) -> list[Server]:
    from tests.helpers import free_port  # the project's own free-port helper

    uvicorn = [sys.executable, "-m", "uvicorn", "--no-access-log", "--log-level", "warning", "--port", "PORT"]
    return [
        Server("bare do-nothing", uvicorn + ["bench.do_nothing_server:app"], free_port(), serves_batches=False),
        Server("FastAPI do-nothing", uvicorn + ["bench.do_nothing_server:fastapi_app"], free_port(),
               serves_batches=False),
        Server("FastAPI+orjson do-nothing", uvicorn + ["bench.do_nothing_server:fastapi_orjson_app"], free_port(),
               serves_batches=False),
        Server("atroposlib 0.4.0", [reference_python, "-m", "atroposlib.cli.run_api", "--host", "127.0.0.1",
                                    "--port", "PORT"], free_port(), in_project=False),
        Server("this project", [sys.executable, "-m", "atroposlib.cli.run_api", "--port", "PORT",
                                "--state-dir", str(workdir / "state"), "--fresh", "--log-level", "warning"],
               free_port()),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=1600, help="groups posted in the ingest phase")
    parser.add_argument("--mixed-groups", type=int, default=400, help="groups posted while a consumer drains")
    parser.add_argument("--clients", type=int, default=32, help="concurrent posting clients")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    parser.add_argument("--uncompressed", action="store_true", help="post plain JSON bodies instead of gzip")
    parser.add_argument("--reference-python", default=DEFAULT_REFERENCE_PYTHON)
    args = parser.parse_args()
    if not Path(args.reference_python).exists():
        raise SystemExit(f"no reference interpreter at {args.reference_python}: run bench/setup_reference.sh")
    groups_per_batch = BATCH_SIZE // SEQUENCES
    args.groups -= args.groups % groups_per_batch  # every group must be servable
    args.mixed_groups -= args.mixed_groups % groups_per_batch

    kind = "plain JSON" if args.uncompressed else "gzip"
    print(f"building {args.groups + args.mixed_groups} {kind} groups of {SEQUENCES}x{TOKENS} tokens ...", flush=True)
    ingest_bodies = make_bodies(args.groups, 0, seed=1, compress=not args.uncompressed)
    mixed_bodies = make_bodies(args.mixed_groups, args.groups, seed=2, compress=not args.uncompressed)
    mean_kib = sum(map(len, ingest_bodies)) / len(ingest_bodies) / 1024
    print(f"mean {kind} body {mean_kib:.1f} KiB; {args.clients} clients; {args.rounds} rounds", flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="atropos-bench-"))
    servers = make_servers(workdir, args.reference_python)
    results: dict[str, list[Result]] = {server.name: [] for server in servers}
    try:
        for round_number in range(1, args.rounds + 1):
            for server in servers:
                argv = server.argv
                server.argv = [a.replace("PORT", str(server.port)) for a in argv]
                server.start(workdir)
                try:
                    result = asyncio.run(run_server(server, ingest_bodies, mixed_bodies, args.clients))
                finally:
                    server.stop()
                    server.argv = argv
                if server.serves_batches:
                    check_delivery(server.name, result)
                results[server.name].append(result)
                print(f"round {round_number} {server.name:<20} ingest {result.ingest:7.1f}  "
                      f"drain {result.drain:7.1f}  mixed {result.mixed:7.1f}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report(results, args.clients)


def report(results: dict[str, list[Result]], clients: int) -> None:
    def median(name: str, metric: str) -> float:
        return statistics.median(getattr(r, metric) for r in results[name])

    bare, fast = median("bare do-nothing", "ingest"), median("FastAPI do-nothing", "ingest")
    fast_orjson = median("FastAPI+orjson do-nothing", "ingest")
    ref = {m: median("atroposlib 0.4.0", m) for m in ("ingest", "drain", "mixed")}
    ours = {m: median("this project", m) for m in ("ingest", "drain", "mixed")}
    print()
    print(f"{'groups/s (median)':<26}{'bare':>9}{'FastAPI':>9}{'FastAPI':>9}{'reference':>11}{'this project':>14}"
          f"{'ours/ref':>10}")
    print(f"{'':<26}{'nothing':>9}{'+orjson':>9}{'nothing':>9}")
    print(f"{'ingest (' + str(clients) + ' clients)':<26}{bare:>9.1f}{fast_orjson:>9.1f}{fast:>9.1f}"
          f"{ref['ingest']:>11.1f}{ours['ingest']:>14.1f}{ours['ingest'] / ref['ingest']:>9.2f}x")
    for metric, label in (("drain", "drain (GET /batch, gzip)"), ("mixed", "mixed (post + drain)")):
        print(f"{label:<26}{'-':>9}{'-':>9}{'-':>9}{ref[metric]:>11.1f}{ours[metric]:>14.1f}"
              f"{ours[metric] / ref[metric]:>9.2f}x")
    print()
    print("ingest as a share of each ceiling (durable, fsync=batch for this project):")
    for label, ceiling in (("bare ASGI + orjson", bare), ("FastAPI + orjson", fast_orjson),
                           ("FastAPI + request.json()", fast)):
        print(f"  {label:<26} reference {ref['ingest'] / ceiling:5.0%}   this project {ours['ingest'] / ceiling:5.0%}")
    print("delivery check: every acknowledged group was served exactly once by both servers")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
