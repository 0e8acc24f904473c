#!/usr/bin/env node
// The guide's Express app (GET /hello -> {"ok": true}) with the sluice middleware in place
// of the guide's ioredis sliding-window middleware, for the anchors harness's HTTP step
// (EXTRA_STACKS). Three modes, each its own process:
//
//   baseline  no middleware
//   allowed   the middleware with a limit no bench run reaches (1e9 per minute)
//   denied    the guide's Express limit: an exact sliding window (log) of 100 per 60 s
//
// Like the guide's app: one Redis, the identity is the x-api-key header (hashed by sluice
// before it becomes a key), 50 ms store timeout, fail open. Express is taken from NODE_PATH
// (the harness's node_modules, the same Express the guide's app runs on); the sluice
// package from SLUICE_NODE_PACKAGE (default: bindings/node, this file's parent).
//
//   SLUICE_BENCH_MODE=allowed REDIS_URL=redis://127.0.0.1:6390/0 PORT=8100 \
//     NODE_PATH=ANCHORS/node_modules node bindings/node/bench/express_app.js
'use strict';

const path = require('node:path');
const express = require('express');

const pkg = process.env.SLUICE_NODE_PACKAGE || path.join(__dirname, '..');
const { Limiter, Policy } = require(pkg);
const { rateLimit } = require(path.join(pkg, 'lib', 'express.js'));

const LIMITS = { allowed: 1_000_000_000, denied: 100 };
const mode = process.env.SLUICE_BENCH_MODE || 'denied';
if (mode !== 'baseline' && !(mode in LIMITS)) {
  console.error(`SLUICE_BENCH_MODE must be baseline, allowed or denied, not ${JSON.stringify(mode)}`);
  process.exit(2);
}
const port = Number(process.env.PORT);
if (!Number.isInteger(port) || port <= 0) {
  console.error('PORT must be a TCP port');
  process.exit(2);
}

async function main() {
  const app = express();
  if (mode !== 'baseline') {
    const limiter = await Limiter.connect(process.env.REDIS_URL, { timeoutMs: 50 });
    const minute = Policy.slidingLog('minute', { limit: LIMITS[mode], window: '60s' });
    app.use(rateLimit({ limiter, policies: [minute], apiKeyHeader: 'x-api-key' }));
  }
  app.get('/hello', (req, res) => res.json({ ok: true }));
  app.listen(port, '127.0.0.1');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
