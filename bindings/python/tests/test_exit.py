"""A script that used the engine on Redis exits cleanly: worker threads finishing a hand-off to
the event loop while the interpreter shuts down must not abort the process."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys, sluice

    async def main():
        limiter = await sluice.Limiter.connect(sys.argv[1])
        burst = sluice.Policy.token_bucket("burst", capacity=1000, rate="5/s")
        for _ in range(3):
            await limiter.check(burst, "exit:probe")

    asyncio.run(main())
    """
)


def test_scripts_exit_cleanly_after_redis_checks(redis_server):
    codes = []
    for _ in range(12):
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, redis_server.url],
            capture_output=True,
            timeout=60,
        )
        codes.append(done.returncode)
    assert codes == [0] * len(codes), codes
