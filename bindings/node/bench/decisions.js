#!/usr/bin/env node
// A client bench for the anchors harness (EXTRA_CLIENTS): CONC concurrent async loops,
// each picking a random key out of KEYSPACE and making one decision through this package,
// for WARMUP + DURATION seconds; only decisions started after the warm-up are counted.
// The policy is the guide's token bucket (10 burst, 5/s, cost 1), so the numbers compare
// like for like with the harness's ioredis and rate-limiter-flexible clients. Prints one
// JSON object (the fields the harness reads) on its last line.
//
//   node bindings/node/bench/decisions.js --redis redis://127.0.0.1:6390 --duration 10 \
//     --warmup 1 --conc 64 --keyspace 100000 [--algorithm token-bucket]
'use strict';

const { parseArgs } = require('node:util');
const path = require('node:path');
// SLUICE_NODE_PACKAGE: another copy of the package (scripts/bench-bindings keeps a release
// build of its own there, so a debug rebuild of bindings/node during a run changes nothing).
const pkgDir = process.env.SLUICE_NODE_PACKAGE || path.join(__dirname, '..');
const { Limiter, Policy } = require(pkgDir);

const { values } = parseArgs({
  options: {
    redis: { type: 'string', default: 'memory' },
    duration: { type: 'string', default: '10' },
    warmup: { type: 'string', default: '1' },
    conc: { type: 'string', default: '64' },
    keyspace: { type: 'string', default: '100000' },
    algorithm: { type: 'string', default: 'token-bucket' },
  },
});
const duration = Number(values.duration);
const warmup = Number(values.warmup);
const conc = Number(values.conc);
const keyspace = Number(values.keyspace);
for (const [k, v] of Object.entries({ duration, warmup, conc, keyspace })) {
  if (!Number.isFinite(v) || v < 0 || (k !== 'warmup' && v === 0)) {
    console.error(`--${k} must be a positive number`);
    process.exit(2);
  }
}

// The guide's limits, per algorithm: 10 at once, 5 a second (or 10 per 2 s).
const POLICIES = {
  'token-bucket': () => Policy.tokenBucket('bench', { capacity: 10, rate: '5/s' }),
  gcra: () => Policy.gcra('bench', { rate: '5/s', burst: 9 }),
  'leaky-bucket': () => Policy.leakyBucket('bench', { capacity: 10, rate: '5/s' }),
  'fixed-window': () => Policy.fixedWindow('bench', { limit: 10, window: '2s' }),
  'sliding-counter': () => Policy.slidingCounter('bench', { limit: 10, window: '2s' }),
  'sliding-log': () => Policy.slidingLog('bench', { limit: 10, window: '2s' }),
};
if (!POLICIES[values.algorithm]) {
  console.error(`--algorithm: one of ${Object.keys(POLICIES).join(', ')}`);
  process.exit(2);
}

/** A small per-loop random generator (xorshift), so loops share no state. */
function randomKeys(seed) {
  let x = (Math.imul(seed + 1, 2654435761) >>> 0) || 1;
  return () => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x % keyspace;
  };
}

function percentile(sorted, p) {
  if (sorted.length === 0) return null;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i] / 1000; // ns -> µs
}

async function main() {
  const limiter = await Limiter.connect(values.redis, { timeoutMs: 1000 });
  const policy = POLICIES[values.algorithm]();
  const now = () => Number(process.hrtime.bigint());
  const started = now();
  const measureFrom = started + warmup * 1e9;
  const stopAt = measureFrom + duration * 1e9;
  const latencies = [];
  const counts = { allowed: 0, denied: 0, errors: 0 };
  let total = 0;
  let firstError = null;

  async function loop(i) {
    const nextKey = randomKeys(i);
    for (;;) {
      const t0 = now();
      if (t0 >= stopAt) return;
      const d = await limiter.check(policy, `user:${nextKey()}`);
      const t1 = now();
      total++;
      // A store failure is admitted (fail open) and counted as an error, not a decision.
      const failed = d.verdict !== 'decided';
      if (failed) firstError ??= d.verdict;
      if (t0 < measureFrom) continue;
      if (failed) counts.errors++;
      else {
        latencies.push(t1 - t0);
        counts[d.allowed ? 'allowed' : 'denied']++;
      }
    }
  }

  const cpu0 = process.cpuUsage();
  await Promise.all(Array.from({ length: conc }, (_, i) => loop(i)));
  const ended = now();
  const cpu = process.cpuUsage(cpu0);
  const sorted = Float64Array.from(latencies).sort();
  const measured = (ended - measureFrom) / 1e9;
  const pkg = require(path.join(pkgDir, 'package.json'));
  console.log(
    JSON.stringify({
      name: `sluice (node) ${values.algorithm}`,
      lib: `sluice node ${pkg.version}`,
      decisions: sorted.length,
      elapsed_s: +measured.toFixed(3),
      decisions_per_s: +(sorted.length / measured).toFixed(1),
      ...counts,
      p50_us: percentile(sorted, 50),
      p90_us: percentile(sorted, 90),
      p99_us: percentile(sorted, 99),
      p999_us: percentile(sorted, 99.9),
      max_us: sorted.length ? sorted[sorted.length - 1] / 1000 : null,
      decisions_incl_warmup: total,
      client_cpu_s_per_s: +((cpu.user + cpu.system) / 1e6 / ((ended - started) / 1e9)).toFixed(2),
      conc,
      keyspace,
      first_error: firstError,
    }),
  );
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
