// The Express example of docs/integrations.md (examples/integrations/express_client.js) in
// front of a real `sluice serve`: 1,000 concurrent requests at a limit of 10 admit exactly 10,
// and when sluice cannot answer the example refuses (503) unless failing open was chosen.
// The app runs in a node process of its own; sluice is the CLI built by scripts/test-node.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const http = require('node:http');
const net = require('node:net');
const { spawn } = require('node:child_process');
const { freePort, sluiceBin, watchdog } = require('../test-support/support.js');

const ROOT = path.resolve(__dirname, '../../..');
const EXAMPLE = path.join(ROOT, 'examples/integrations/express_client.js');
const CONFIG = `
[store]
url = "memory"

[policies.burst]
algorithm = "fixed-window"
limit = 10
window = "1h"
`;
const REQUESTS = 1000;

async function waitForPort(port, proc, what, withinMs = 20000) {
  const deadline = Date.now() + withinMs;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) throw new Error(`${what} exited with ${proc.exitCode}`);
    const up = await new Promise((resolve) => {
      const s = net.connect(port, '127.0.0.1', () => { s.destroy(); resolve(true); });
      s.on('error', () => resolve(false));
    });
    if (up) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${what} did not listen on ${port} within ${withinMs} ms`);
}

function stop(proc) {
  return new Promise((resolve) => {
    if (proc.exitCode !== null) return resolve();
    const t = setTimeout(() => proc.kill('SIGKILL'), 10000);
    proc.once('exit', () => { clearTimeout(t); resolve(); });
    proc.kill('SIGTERM');
  });
}

async function startSluice() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-examples-'));
  const file = path.join(dir, 'sluice.toml');
  fs.writeFileSync(file, CONFIG);
  const httpPort = await freePort();
  const grpcPort = await freePort();
  const proc = spawn(sluiceBin(), ['serve', '--config', file, '--http', `127.0.0.1:${httpPort}`,
    '--grpc', `127.0.0.1:${grpcPort}`], { stdio: ['ignore', 'ignore', 'inherit'] });
  watchdog(proc.pid);
  await waitForPort(httpPort, proc, 'sluice serve');
  return { url: `http://127.0.0.1:${httpPort}`, proc };
}

/** The example app; `log()` is what it wrote to stderr (why it refused, when it did). */
async function startApp(sluiceUrl, env = {}) {
  const port = await freePort();
  const proc = spawn(process.execPath, [EXAMPLE], {
    env: { ...process.env, SLUICE_URL: sluiceUrl, PORT: String(port), ...env },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  watchdog(proc.pid);
  let stderr = '';
  proc.stderr.setEncoding('utf8');
  proc.stderr.on('data', (c) => { if (stderr.length < 4000) stderr += c; });
  await waitForPort(port, proc, 'the Express example');
  return { base: `http://127.0.0.1:${port}`, proc, log: () => stderr };
}

/** `n` concurrent GET /hello; counts statuses ('transport' for no answer). */
async function fire(base, n) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: n });
  const one = () => new Promise((resolve) => {
    const req = http.get(`${base}/hello`, { agent }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode));
    });
    req.on('error', () => resolve('transport'));
    req.setTimeout(60000, () => req.destroy());
  });
  const statuses = await Promise.all(Array.from({ length: n }, one));
  agent.destroy();
  const counts = {};
  for (const s of statuses) counts[s] = (counts[s] || 0) + 1;
  return counts;
}

test('the Express example admits exactly the limit under 1,000 concurrent requests', { timeout: 60000 }, async () => {
  const sluice = await startSluice();
  try {
    // The example's 1.5 s deadline covers the wait for one of its 64 pooled sockets, and
    // 1,000 requests queue on that pool: on a loaded machine the last ones passed 1.5 s and
    // the example refused them itself (503, "sluice timed out"), up to half of them. That
    // deadline is the example's answer to a slow sluice (fail closed, tested below); here
    // it is lifted so every request is decided by sluice and the count is exact.
    const app = await startApp(sluice.url, { SLUICE_TIMEOUT_MS: '50000' });
    try {
      const started = Date.now();
      const counts = await fire(app.base, REQUESTS);
      console.log(`express example, ${REQUESTS} concurrent at a limit of 10: ${JSON.stringify(counts)} in ${Date.now() - started} ms`);
      assert.deepStrictEqual(counts, { 200: 10, 429: REQUESTS - 10 },
        `${JSON.stringify(counts)}; the example's stderr: ${app.log()}`);
    } finally {
      await stop(app.proc);
    }
  } finally {
    await stop(sluice.proc);
  }
});

test('the Express example fails closed unless told otherwise', { timeout: 60000 }, async () => {
  const nobody = `http://127.0.0.1:${await freePort()}`; // nothing listens there
  let app = await startApp(nobody);
  try {
    assert.deepStrictEqual(await fire(app.base, 20), { 503: 20 });
  } finally {
    await stop(app.proc);
  }
  app = await startApp(nobody, { SLUICE_FAIL_OPEN: '1' });
  try {
    assert.deepStrictEqual(await fire(app.base, 20), { 200: 20 });
  } finally {
    await stop(app.proc);
  }
});
