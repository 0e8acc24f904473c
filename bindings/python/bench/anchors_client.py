"""The anchors harness's client bench for the sluice Python package: CONC asyncio tasks,
each checking the guide's token bucket (10 burst + 5/s, cost 1) for a random identity out of
KEYSPACE, through `sluice.Limiter` on the step's Redis. The driver (timing, warm-up, JSON
line) is the harness's own `clients/benchlib.py`, so the numbers compare like for like with
its redis-py client (`py_tb.py`, the guide's script).

    echo 'py_sluice|ANCHORS_PY bindings/python/bench/anchors_client.py --port {PORT} \
      --duration {DURATION} --warmup {WARMUP} --conc {CONC} --keyspace {KEYSPACE}' > sluice.clients
    EXTRA_CLIENTS=sluice.clients ../shared/anchors/run.sh clients

ANCHORS_PY is a Python with the sluice wheel built in release mode (`pip install
./bindings/python`) and the harness's requirements; ANCHORS_HOME (default
../shared/anchors) says where benchlib.py is.
"""

import asyncio
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ANCHORS = Path(os.environ.get("ANCHORS_HOME", HERE.parents[2] / ".." / "shared" / "anchors"))
sys.path.insert(0, str(ANCHORS / "clients"))

from benchlib import drive, parse_args  # noqa: E402

import sluice  # noqa: E402


async def main():
    args = parse_args()
    limiter = await sluice.Limiter.connect(f"redis://127.0.0.1:{args.port}/0", timeout_ms=1000)
    burst = sluice.Policy.token_bucket("tb", capacity=10, rate="5/s")

    async def decide(identity):
        return (await limiter.check(burst, identity)).allowed

    await drive("sluice Python (Limiter.check, token bucket)", decide, args, "user:{}",
                {"lib": "sluice " + sluice.__version__})


asyncio.run(main())
