// Real servers for the tests: redis-server on a free loopback port (never the default one),
// the sluice CLI, and apps listening on 127.0.0.1:0. Nothing is mocked.
'use strict';

const { spawn, execFileSync } = require('node:child_process');
const net = require('node:net');
const path = require('node:path');
const crypto = require('node:crypto');

/** A free TCP port on 127.0.0.1. */
function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

function ping(port) {
  return new Promise((resolve) => {
    const s = net.createConnection({ host: '127.0.0.1', port });
    const done = (ok) => {
      s.destroy();
      resolve(ok);
    };
    s.setTimeout(200, () => done(false));
    s.once('error', () => done(false));
    s.once('connect', () => s.write('PING\r\n'));
    s.once('data', (d) => done(d.toString().startsWith('+PONG')));
  });
}

/**
 * A `sh` loop that kills `pid` once this test process is gone. A test's teardown never runs
 * when the test run itself is killed; the watchdog does, so no server outlives its tests. It
 * ends by itself within a second of `pid` ending, and never keeps this process alive.
 */
function watchdog(pid) {
  const script =
    `while kill -0 ${process.pid} 2>/dev/null && kill -0 ${pid} 2>/dev/null; do sleep 1; done; ` +
    `kill -9 ${pid} 2>/dev/null`;
  const dog = spawn('sh', ['-c', script], { stdio: 'ignore' });
  dog.unref();
  return dog;
}

/** Starts a redis-server of its own, without persistence; `stop()` ends it. */
async function startRedis() {
  const port = await freePort();
  const exe = process.env.SLUICE_REDIS_SERVER || 'redis-server';
  const proc = spawn(exe, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], {
    stdio: 'ignore',
  });
  const dog = watchdog(proc.pid);
  let exited = false;
  proc.once('exit', () => {
    exited = true;
    dog.kill('SIGKILL');
  });
  const deadline = Date.now() + 10_000;
  while (Date.now() < deadline && !exited) {
    if (await ping(port)) {
      return {
        port,
        url: `redis://127.0.0.1:${port}`,
        async stop() {
          if (exited) return;
          const gone = new Promise((r) => proc.once('exit', r));
          proc.kill('SIGCONT');
          proc.kill('SIGTERM');
          await gone;
        },
        /** Freezes the server (SIGSTOP): connections stay open and nothing answers. */
        pause() {
          proc.kill('SIGSTOP');
        },
        resume() {
          proc.kill('SIGCONT');
        },
        /** Sends one inline command and resolves to the first reply bytes. */
        command(line) {
          return new Promise((resolve, reject) => {
            const s = net.createConnection({ host: '127.0.0.1', port }, () => s.write(line + '\r\n'));
            s.setTimeout(5000, () => {
              s.destroy();
              reject(new Error(`redis: no answer to ${line}`));
            });
            s.once('data', (d) => {
              s.destroy();
              resolve(d.toString());
            });
            s.once('error', reject);
          });
        },
      };
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  proc.kill('SIGKILL');
  throw new Error(`redis-server (${exe}) did not start on port ${port} within 10 s`);
}

/** A fresh identity, so tests sharing one Redis never share state. */
function freshIdentity(prefix = 'user') {
  return `${prefix}:${crypto.randomBytes(6).toString('hex')}`;
}

/** The sluice CLI (built by scripts/test-node). */
function sluiceBin() {
  return process.env.SLUICE_BIN || path.resolve(__dirname, '../../../target/debug/sluice');
}

/** Listens on 127.0.0.1:0; resolves to { base, close }. */
function listen(server) {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      resolve({
        base: `http://127.0.0.1:${port}`,
        close: () =>
          new Promise((r) => {
            server.closeAllConnections?.();
            server.close(() => r());
          }),
      });
    });
  });
}

/** A GET over a fresh connection; resolves to { status, headers, body }. */
async function get(base, pathname, headers = {}) {
  const res = await fetch(base + pathname, { headers: { connection: 'close', ...headers } });
  const body = await res.text();
  return { status: res.status, headers: res.headers, body };
}

module.exports = { freePort, watchdog, startRedis, freshIdentity, sluiceBin, listen, get, execFileSync };
