#!/usr/bin/env node
// CPU time per decision of the Node client, on a bounded number of decisions: a measure that
// moves much less than decisions/s when other processes share the cores (it counts the
// client's own CPU, not the time it waited for one). CONC concurrent loops make DECISIONS
// checks in all (the guide's token bucket, random keys out of KEYSPACE), after WARMUP checks
// that are not counted. Prints one JSON object: CPU µs per decision for the whole process and
// split by thread (the JS thread, tokio's workers, the rest), from /proc/self/task/*/stat.
//
//   node bindings/node/bench/cpu_per_decision.js --redis redis://127.0.0.1:6390 \
//     --decisions 200000 --warmup 20000 --conc 64 --keyspace 100000
//
// SLUICE_NODE_PACKAGE picks another copy of the package (as in decisions.js), so two builds
// can be compared in turns against one Redis.
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const { parseArgs } = require('node:util');
const pkgDir = process.env.SLUICE_NODE_PACKAGE || path.join(__dirname, '..');
const { Limiter, Policy } = require(pkgDir);

const { values } = parseArgs({
  options: {
    redis: { type: 'string', default: 'memory' },
    decisions: { type: 'string', default: '200000' },
    warmup: { type: 'string', default: '20000' },
    conc: { type: 'string', default: '64' },
    keyspace: { type: 'string', default: '100000' },
  },
});
const decisions = Number(values.decisions);
const warmup = Number(values.warmup);
const conc = Number(values.conc);
const keyspace = Number(values.keyspace);

/** Clock ticks of CPU (user + system) per thread name, from /proc/self/task/<tid>/stat. */
function threadTicks() {
  const out = {};
  for (const tid of fs.readdirSync('/proc/self/task')) {
    let stat;
    try {
      stat = fs.readFileSync(`/proc/self/task/${tid}/stat`, 'utf8');
    } catch {
      continue; // the thread ended meanwhile
    }
    const name = stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'));
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const ticks = Number(fields[11]) + Number(fields[12]); // utime + stime
    const group = Number(tid) === process.pid ? 'js' : name.startsWith('tokio') ? 'tokio' : 'other';
    out[group] = (out[group] ?? 0) + ticks;
  }
  return out;
}

/** Runs `count` checks over `conc` loops. */
async function run(limiter, policy, count, seed) {
  let left = count;
  async function loop(i) {
    let x = (Math.imul(seed + i + 1, 2654435761) >>> 0) || 1;
    while (left > 0) {
      left--;
      x ^= x << 13;
      x >>>= 0;
      x ^= x >>> 17;
      x ^= x << 5;
      x >>>= 0;
      const d = await limiter.check(policy, `user:${x % keyspace}`);
      if (d.verdict !== 'decided') throw new Error(`check failed: ${d.verdict}`);
    }
  }
  await Promise.all(Array.from({ length: conc }, (_, i) => loop(i)));
}

async function main() {
  const limiter = await Limiter.connect(values.redis, { timeoutMs: 1000 });
  const policy = Policy.tokenBucket('bench', { capacity: 10, rate: '5/s' });
  await run(limiter, policy, warmup, 1000);
  const ticksPerS = 100; // USER_HZ on Linux
  const t0 = threadTicks();
  const cpu0 = process.cpuUsage();
  const wall0 = process.hrtime.bigint();
  await run(limiter, policy, decisions, 0);
  const wall = Number(process.hrtime.bigint() - wall0) / 1e9;
  const cpu = process.cpuUsage(cpu0);
  const t1 = threadTicks();
  const perDecision = (us) => +(us / decisions).toFixed(2);
  const threads = {};
  for (const k of new Set([...Object.keys(t0), ...Object.keys(t1)])) {
    threads[`${k}_us_per_decision`] = perDecision((((t1[k] ?? 0) - (t0[k] ?? 0)) / ticksPerS) * 1e6);
  }
  console.log(
    JSON.stringify({
      decisions,
      conc,
      wall_s: +wall.toFixed(3),
      decisions_per_s: Math.round(decisions / wall),
      cpu_us_per_decision: perDecision(cpu.user + cpu.system),
      user_us_per_decision: perDecision(cpu.user),
      system_us_per_decision: perDecision(cpu.system),
      ...threads,
    }),
  );
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
