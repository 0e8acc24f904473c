"""One limit across languages: the Python package and the Rust CLI (`sluice check`) fire at
one identity on one Redis at the same moment, and the total admitted equals the limit
exactly, for every algorithm. Both run the same Lua scripts on the same key."""

import asyncio
import json
import subprocess
import uuid

import pytest

from sluice import Limiter, Policy
from conftest import sluice_bin

LIMIT = 20
PER_SIDE = 30  # each side alone could take the whole limit
PYTHON_MAX = 400
# (CLI flags, Python policy), quota LIMIT, refilling or sliding too slowly to matter.
CASES = {
    "token-bucket": (["--capacity", "20", "--rate", "20/h"], lambda n: Policy.token_bucket(n, capacity=20, rate="20/h")),
    "gcra": (["--rate", "20/h", "--burst", "19"], lambda n: Policy.gcra(n, rate="20/h", burst=19)),
    "leaky-bucket": (["--capacity", "20", "--rate", "20/h"], lambda n: Policy.leaky_bucket(n, capacity=20, rate="20/h")),
    "fixed-window": (["--limit", "20", "--window", "1d"], lambda n: Policy.fixed_window(n, limit=20, window="1d")),
    "sliding-counter": (["--limit", "20", "--window", "1h"], lambda n: Policy.sliding_counter(n, limit=20, window="1h")),
    "sliding-log": (["--limit", "20", "--window", "1h"], lambda n: Policy.sliding_log(n, limit=20, window="1h")),
    "concurrency": (["--limit", "20", "--lease", "1m"], lambda n: Policy.concurrency(n, limit=20, lease="1m")),
}


@pytest.mark.parametrize("algorithm", sorted(CASES))
def test_python_and_rust_share_one_limit_exactly(algorithm, redis_server):
    flags, make = CASES[algorithm]
    name = f"x-{algorithm}"
    identity = f"cross:{uuid.uuid4().hex[:12]}"
    policy = make(name)

    async def run():
        limiter = await Limiter.connect(redis_server.url, timeout_ms=2000)
        cli = await asyncio.create_subprocess_exec(
            sluice_bin(), "check", identity, "--algorithm", algorithm, *flags, "--name", name,
            "--store", redis_server.url, "--timeout", "2s", "-n", str(PER_SIDE), "--json",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        # Python keeps firing while the CLI runs (bounded: at most PYTHON_MAX checks).
        communicate = asyncio.ensure_future(asyncio.wait_for(cli.communicate(), timeout=60))
        decisions = []
        while len(decisions) < PYTHON_MAX and (not communicate.done() or len(decisions) < PER_SIDE):
            decisions += await asyncio.gather(*[limiter.check(policy, identity) for _ in range(5)])
        out, err = await communicate
        assert cli.returncode == 0, err.decode()
        lines = [json.loads(line) for line in out.decode().splitlines()]
        assert len(lines) == PER_SIDE
        return sum(d.allowed for d in decisions), sum(line["allowed"] for line in lines)

    python_admitted, rust_admitted = asyncio.run(run())
    print(f"{algorithm}: python {python_admitted}, rust {rust_admitted}")
    assert python_admitted + rust_admitted == LIMIT, (python_admitted, rust_admitted)
