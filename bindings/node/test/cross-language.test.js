// One limit across languages: this package and the Rust CLI (`sluice check`), and the
// Python package when its test venv is there, fire at one identity on one Redis at the
// same moment, and the total admitted equals the limit exactly, for every algorithm. All of
// them run the same Lua scripts on the same key.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const { Limiter, Policy } = require('sluice');
const { startRedis, freshIdentity, sluiceBin } = require('../test-support/support');

const LIMIT = 20;
const PER_PROCESS = 30; // each process alone could take the whole limit
const NODE_MAX = 400; // Node's checks are bounded in count as well as in time

// CLI flags, the Node policy and the Python constructor of each algorithm: quota LIMIT,
// refilling or sliding far too slowly to matter during the test.
const CASES = {
  'token-bucket': [['--capacity', '20', '--rate', '20/h'], (n) => Policy.tokenBucket(n, { capacity: 20, rate: '20/h' }), 'token_bucket(n, capacity=20, rate="20/h")'],
  gcra: [['--rate', '20/h', '--burst', '19'], (n) => Policy.gcra(n, { rate: '20/h', burst: 19 }), 'gcra(n, rate="20/h", burst=19)'],
  'leaky-bucket': [['--capacity', '20', '--rate', '20/h'], (n) => Policy.leakyBucket(n, { capacity: 20, rate: '20/h' }), 'leaky_bucket(n, capacity=20, rate="20/h")'],
  'fixed-window': [['--limit', '20', '--window', '1d'], (n) => Policy.fixedWindow(n, { limit: 20, window: '1d' }), 'fixed_window(n, limit=20, window="1d")'],
  'sliding-counter': [['--limit', '20', '--window', '1h'], (n) => Policy.slidingCounter(n, { limit: 20, window: '1h' }), 'sliding_counter(n, limit=20, window="1h")'],
  'sliding-log': [['--limit', '20', '--window', '1h'], (n) => Policy.slidingLog(n, { limit: 20, window: '1h' }), 'sliding_log(n, limit=20, window="1h")'],
  concurrency: [['--limit', '20', '--lease', '1m'], (n) => Policy.concurrency(n, { limit: 20, lease: '1m' }), 'concurrency(n, limit=20, lease="1m")'],
};

// A Python with the sluice package installed (scripts/test-node points at the Python test
// venv when it exists); without it the Python part is skipped and says so.
const python = process.env.SLUICE_PYTHON && fs.existsSync(process.env.SLUICE_PYTHON) ? process.env.SLUICE_PYTHON : null;

// The Python side connects, says `ready`, waits for `go` on stdin, then checks one at a
// time, 10 ms apart, and prints how many it was admitted.
const PYTHON_SCRIPT = `
import asyncio, os, sys
from sluice import Limiter, Policy
url, identity, n, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
policy = Policy.{CTOR}
async def main():
    limiter = await Limiter.connect(url, timeout_ms=2000)
    print("ready", flush=True)
    sys.stdin.readline()
    admitted = 0
    for _ in range(count):
        admitted += (await limiter.check(policy, identity)).allowed
        await asyncio.sleep(0.01)
    print(admitted, flush=True)
asyncio.run(main())
# Leave without interpreter teardown: the count is out, and what is measured here is the
# shared limit, not the extension's shutdown (which aborted in some runs of this test).
os._exit(0)
`;

let redis;
before(async () => {
  redis = await startRedis();
});
after(async () => {
  await redis?.stop();
});

/**
 * Starts a process (killed after 60 s at the latest): `firstLine` resolves to its first
 * line of output, `done` to all of it once it exits 0.
 */
function start(cmd, args) {
  const child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  let onLine;
  const firstLine = new Promise((resolve) => (onLine = resolve));
  child.stdout.on('data', (d) => {
    out += d;
    if (out.includes('\n')) onLine(out.slice(0, out.indexOf('\n')));
  });
  child.stderr.on('data', (d) => (err += d));
  const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
  const done = new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      onLine('');
      if (code === 0) resolve(out);
      else reject(new Error(`${cmd} exited ${code ?? signal}: ${err}`));
    });
  });
  return { child, firstLine, done };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

for (const [algorithm, [flags, make, pythonCtor]] of Object.entries(CASES)) {
  test(`${algorithm}: Node and Rust${python ? ' and Python' : ''} share one limit exactly`, async (t) => {
    const name = `x-${algorithm}`;
    const identity = freshIdentity('cross');
    const policy = make(name);
    const limiter = await Limiter.connect(redis.url, { timeoutMs: 2000 });
    await limiter.check(Policy.fixedWindow('warm-up', { limit: 1, window: '1s' }), identity); // connected

    // Python (when there) first, connected and waiting; then the CLI, one decision every
    // 20 ms; when the CLI's first decision is out, Python and Node start too, so all of
    // them are deciding on the key at the same moment.
    let py = null;
    if (python) {
      py = start(python, ['-c', PYTHON_SCRIPT.replace('{CTOR}', pythonCtor), redis.url, identity, name, String(PER_PROCESS)]);
      assert.equal(await py.firstLine, 'ready', 'the Python side connected');
    }
    const cli = start(sluiceBin(), [
      'check', identity, '--algorithm', algorithm, ...flags, '--name', name,
      '--store', redis.url, '--timeout', '2s', '-n', String(PER_PROCESS), '--interval', '20ms', '--json',
    ]);
    await cli.firstLine;
    py?.child.stdin.end('go\n');
    let settled = false;
    const all = Promise.all([
      cli.done.then((out) => {
        const lines = out.trim().split('\n').map((l) => JSON.parse(l));
        assert.equal(lines.length, PER_PROCESS);
        return lines.filter((l) => l.allowed).length;
      }),
      ...(py ? [py.done.then((out) => Number(out.trim().split('\n').pop()))] : []),
    ]).finally(() => {
      settled = true;
    });
    // Node checks 10 ms apart while the others run (bounded: at most NODE_MAX checks).
    const decisions = [];
    while (decisions.length < NODE_MAX && !settled) {
      decisions.push(await limiter.check(policy, identity));
      await sleep(10);
    }
    const admittedElsewhere = await all;
    const others = admittedElsewhere.reduce((a, b) => a + b, 0);
    const nodeAdmitted = decisions.filter((d) => d.allowed).length;
    t.diagnostic(`admitted: node ${nodeAdmitted}, rust ${admittedElsewhere[0]}${python ? `, python ${admittedElsewhere[1]}` : ''}`);
    assert.equal(nodeAdmitted + others, LIMIT, `node ${nodeAdmitted}, others ${admittedElsewhere.join(' + ')}`);
  });
}
