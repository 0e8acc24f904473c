// One sluice.toml, four HTTP front ends, the same answers: the tower layer (an axum app,
// crates/server/examples/layer_app.rs), the reverse proxy (`sluice serve` with routes), the
// Python ASGI middleware in a FastAPI app and the Express middleware each get the same
// request sequences (a limit reached, an identity banned after its denials, a deny-listed
// client, a route counting by outcome) on one real Redis, and must answer each request with
// the same status, the same RateLimit / RateLimit-Policy / Retry-After fields and the same
// problem+json type.
//
// scripts/test-node runs it with the Python test venv of scripts/test-python (SLUICE_PYTHON)
// and the layer app it builds (SLUICE_LAYER_APP); scripts/test runs both scripts in order.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const http = require('node:http');
const { startRedis, freePort, sluiceBin, listen } = require('../test-support/support');

const python = process.env.SLUICE_PYTHON && fs.existsSync(process.env.SLUICE_PYTHON) ? process.env.SLUICE_PYTHON : null;
const layerApp = process.env.SLUICE_LAYER_APP && fs.existsSync(process.env.SLUICE_LAYER_APP) ? process.env.SLUICE_LAYER_APP : null;
const missing = [!python && 'SLUICE_PYTHON (scripts/test-python first)', !layerApp && 'SLUICE_LAYER_APP'].filter(Boolean);

/** The file every front end loads. Limits refill far too slowly to move during the test. */
function sluiceToml({ redisPort, upstreamPort, ports }) {
  return `
identity_hash_key = "5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed"

[server]
http = "127.0.0.1:${ports.http}"
grpc = "127.0.0.1:${ports.grpc}"
proxy = "127.0.0.1:${ports.proxy}"
reload_poll = "0s"

[store]
url = "redis://127.0.0.1:${redisPort}"
timeout = "2s"
unresponsive_after = "2s"

[lists]
deny = ["hdr:blocked"]

# Three per user; two denials within a minute ban the user for ten minutes.
[policies.api]
algorithm = "token-bucket"
capacity = 3
rate = "3/h"
identity = "header:x-user"
ban = { after = 2, within = "1m", duration = "10m" }

# A ceiling per client address over the per-user limit: a second identity source on the
# route, so a second decider (a second layer in the proxy), its fields merged.
[policies.per-ip]
algorithm = "token-bucket"
capacity = 1000
rate = "1000/h"
identity = "ip"

# Two wrong passwords per user; right ones are given back.
[policies.logins]
algorithm = "token-bucket"
capacity = 2
rate = "2/h"
identity = "header:x-user"

[[routes]]
prefix = "/api"
policies = ["per-ip", "api"]
upstream = "http://127.0.0.1:${upstreamPort}"

[[routes]]
prefix = "/login"
policies = ["logins"]
count = [401]
upstream = "http://127.0.0.1:${upstreamPort}"

[[routes]]
prefix = "/health"
upstream = "http://127.0.0.1:${upstreamPort}"
`;
}

/** In a sequence: wait for the background work of the requests before it. */
const PAUSE = 'pause';

/** The request sequences; `who` keeps each front end's users apart. */
function sequences(who) {
  const user = (name) => ({ 'x-user': `${name}-${who}` });
  const login = (password, name) => ['GET', `/login?password=${password}`, user(name)];
  return {
    // 3 admitted, 2 denied, then banned. A denial is counted towards the ban in the
    // background (a store script), so the ban is looked at a moment later.
    'limit reached, then banned': [
      ...Array.from({ length: 5 }, () => ['GET', '/api/items', user('alice')]),
      PAUSE,
      ...Array.from({ length: 2 }, () => ['GET', '/api/items', user('alice')]),
    ],
    'deny-listed client': [
      ['GET', '/api/items', { 'x-user': 'blocked' }],
      ['GET', '/login?password=right', { 'x-user': 'blocked' }],
      ['GET', '/api/items', user('dave')],
    ],
    // Right passwords are refunded; the third wrong one is refused, then so is a right one.
    'count by outcome': [
      login('right', 'carol'),
      login('right', 'carol'),
      login('right', 'carol'),
      login('wrong', 'carol'),
      login('wrong', 'carol'),
      login('wrong', 'carol'),
      login('right', 'carol'),
    ],
    'unlimited route': [['GET', '/health', user('erin')]],
  };
}

/** One request; what every front end must answer alike. */
function send(base, [method, target, headers], localAddress = '127.0.0.1') {
  return new Promise((resolve, reject) => {
    const options = { method, localAddress, headers: { connection: 'close', ...headers } };
    const req = http.request(base + target, options, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const body = Buffer.concat(chunks).toString();
        const type = res.headers['content-type'] || '';
        let problem = null;
        if (type.startsWith('application/problem+json')) problem = JSON.parse(body).type ?? null;
        resolve({
          status: res.statusCode,
          ratelimit: res.headers['ratelimit'] ?? null,
          ratelimitPolicy: res.headers['ratelimit-policy'] ?? null,
          retryAfter: res.headers['retry-after'] ?? null,
          problem,
        });
      });
    });
    req.setTimeout(10_000, () => req.destroy(new Error(`${method} ${target}: no answer in 10 s`)));
    req.on('error', reject);
    req.end();
  });
}

/** Waits until something accepts HTTP on `base`. */
async function ready(base, what, proc) {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (proc && proc.exitCode !== null) throw new Error(`${what} exited with ${proc.exitCode}: ${proc.output()}`);
    try {
      await send(base, ['GET', '/__ready', {}]);
      return;
    } catch {
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  throw new Error(`${what} did not answer on ${base} within 60 s: ${proc ? proc.output() : ''}`);
}

/** Starts a process whose output is kept for error messages; `stop()` ends it. */
function start(what, exe, args, env = {}) {
  const proc = spawn(exe, args, { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  proc.stdout.on('data', (d) => (output += d));
  proc.stderr.on('data', (d) => (output += d));
  proc.output = () => output.slice(-4000);
  proc.stop = async () => {
    if (proc.exitCode !== null || proc.signalCode !== null) return;
    const gone = new Promise((r) => proc.once('exit', r));
    proc.kill('SIGTERM');
    const killer = setTimeout(() => proc.kill('SIGKILL'), 5000);
    await gone;
    clearTimeout(killer);
  };
  return proc;
}

/** The upstream of the proxy: the endpoints the layer app and the test apps serve. */
function upstream() {
  return http.createServer((req, res) => {
    const url = new URL(req.url, 'http://x');
    res.setHeader('content-type', 'application/json');
    if (url.pathname === '/login') {
      const ok = url.searchParams.get('password') === 'right';
      res.statusCode = ok ? 200 : 401;
      res.end(JSON.stringify({ ok }));
      return;
    }
    res.end(JSON.stringify({ path: url.pathname }));
  });
}

const FASTAPI_APP = `
import sys
import uvicorn
import sluice.asgi
from fastapi import FastAPI
from fastapi.responses import JSONResponse

app = FastAPI()
app.add_middleware(sluice.asgi.RateLimitMiddleware, config=sys.argv[1])


@app.api_route("/login", methods=["GET", "POST"])
async def login(password: str = ""):
    ok = password == "right"
    return JSONResponse({"ok": ok}, status_code=200 if ok else 401)


@app.api_route("/{rest:path}", methods=["GET", "POST"])
async def other(rest: str):
    return {"path": "/" + rest}


uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
`;

let redis;
let dir;
const stops = [];
const fronts = {};

before(async () => {
  if (missing.length) return;
  redis = await startRedis();
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-front-ends-'));
  const up = await listen(upstream());
  stops.push(up.close);
  const ports = { http: await freePort(), grpc: await freePort(), proxy: await freePort() };
  const config = path.join(dir, 'sluice.toml');
  fs.writeFileSync(config, sluiceToml({ redisPort: redis.port, upstreamPort: Number(new URL(up.base).port), ports }));

  // The tower layer.
  const layerPort = await freePort();
  const layer = start('layer_app', layerApp, [config, String(layerPort)]);
  stops.push(layer.stop);
  fronts.layer = `http://127.0.0.1:${layerPort}`;
  // The proxy.
  const proxy = start('sluice serve', sluiceBin(), ['serve', '--config', config]);
  stops.push(proxy.stop);
  fronts.proxy = `http://127.0.0.1:${ports.proxy}`;
  // FastAPI with the ASGI middleware.
  const pyPort = await freePort();
  const appFile = path.join(dir, 'fastapi_app.py');
  fs.writeFileSync(appFile, FASTAPI_APP);
  const fastapi = start('FastAPI app', python, [appFile, config, String(pyPort)]);
  stops.push(fastapi.stop);
  fronts.fastapi = `http://127.0.0.1:${pyPort}`;
  // Express with its middleware, in this process.
  const express = require('express');
  const { rateLimit } = require('sluice/express');
  const app = express();
  app.use(rateLimit({ config }));
  app.all('/login', (req, res) => {
    const ok = req.query.password === 'right';
    res.status(ok ? 200 : 401).json({ ok });
  });
  app.use((req, res) => res.json({ path: req.path }));
  const server = await listen(http.createServer(app));
  stops.push(server.close);
  fronts.express = server.base;

  await Promise.all([
    ready(fronts.layer, 'layer_app', layer),
    ready(fronts.proxy, 'sluice serve', proxy),
    ready(fronts.fastapi, 'the FastAPI app', fastapi),
    ready(fronts.express, 'the Express app'),
  ]);
});

after(async () => {
  for (const stop of stops.reverse()) await stop();
  await redis?.stop();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

test('the layer, the proxy, FastAPI and Express answer one sluice.toml alike', { skip: missing.length ? `needs ${missing.join(', ')}` : false, timeout: 120_000 }, async () => {
  const answers = {};
  // The front ends one after the other, each request after the previous one's answer, each
  // front end's requests from a loopback address of its own (its own per-IP bucket).
  for (const [i, [front, base]] of Object.entries(fronts).entries()) {
    answers[front] = {};
    for (const [name, requests] of Object.entries(sequences(front))) {
      const got = [];
      for (const r of requests) {
        if (r === PAUSE) await new Promise((resolve) => setTimeout(resolve, 300));
        else got.push(await send(base, r, `127.0.0.${i + 2}`));
      }
      answers[front][name] = got;
    }
  }
  const statuses = (front, name) => answers[front][name].map((a) => a.status);
  // What the layer answers is what the issue asks of every front end.
  assert.deepEqual(statuses('layer', 'limit reached, then banned'), [200, 200, 200, 429, 429, 429, 429]);
  assert.deepEqual(statuses('layer', 'deny-listed client'), [403, 403, 200]);
  assert.deepEqual(statuses('layer', 'count by outcome'), [200, 200, 200, 401, 401, 429, 429]);
  assert.deepEqual(statuses('layer', 'unlimited route'), [200]);
  const banned = answers.layer['limit reached, then banned'][6];
  assert.equal(banned.retryAfter, '600', 'the ban, not the bucket, sets Retry-After');
  // Right passwords were given back: the first wrong one still sees 1 of 2 left after it.
  assert.match(answers.layer['count by outcome'][2].ratelimit, /r=2/);
  assert.match(answers.layer['count by outcome'][3].ratelimit, /r=1/);
  assert.ok(answers.layer['deny-listed client'][0].problem, 'a 403 is problem+json');
  // Both identity sources of the route in the fields.
  assert.match(answers.layer['limit reached, then banned'][0].ratelimitPolicy, /"per-ip";q=1000;w=3600.*"api";q=3;w=3600|"api";q=3;w=3600.*"per-ip";q=1000;w=3600/);
  for (const front of ['proxy', 'fastapi', 'express']) {
    for (const name of Object.keys(answers.layer)) {
      assert.deepEqual(answers[front][name], answers.layer[name], `${front}, ${name}`);
    }
  }
});
