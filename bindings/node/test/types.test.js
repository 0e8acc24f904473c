// The TypeScript declarations compile against the documented usage (strict mode), when the
// TypeScript compiler is installed next to the test dependencies (scripts/test-node does).
'use strict';

const { test } = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');

let tsc = null;
try {
  tsc = require.resolve('typescript/bin/tsc');
} catch {
  // not installed: the test says it is skipped
}

test('index.d.ts, express.d.ts and fastify.d.ts type the documented usage', { skip: tsc ? false : 'typescript is not installed' }, () => {
  const file = path.join(__dirname, '..', 'test-support', 'types-usage.ts');
  const types = path.dirname(require.resolve('@types/node/package.json'));
  const run = spawnSync(
    process.execPath,
    [tsc, '--noEmit', '--strict', '--module', 'commonjs', '--target', 'es2022', '--typeRoots', path.dirname(types), '--types', 'node', file],
    { encoding: 'utf8', timeout: 120_000 },
  );
  assert.equal(run.status, 0, run.stdout + run.stderr);
});
