#!/usr/bin/env node
// The package's `install` script: makes sure there is an addon to load, building it with
// cargo only when it has to.
//
// Installed from the npm tarballs (`scripts/package`), the addon comes prebuilt in the
// platform package (`sluice-linux-x64-gnu`, an optional dependency): nothing is built, and no
// Rust toolchain is needed. Installed from the repository (`npm install ./bindings/node`),
// this builds it with cargo and copies it next to index.js as `sluice.node`; that needs a Rust
// toolchain and the sluice workspace this folder sits in, and nothing downloaded at run time.
// SLUICE_NODE_PROFILE=debug builds without optimisations (faster to build, for tests); the
// default is release. SLUICE_NODE_SKIP_BUILD=1 keeps an existing sluice.node.
'use strict';

const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const addon = require('../lib/addon.js');

const here = path.resolve(__dirname, '..');
const out = addon.localAddon;

if (process.env.SLUICE_NODE_SKIP_BUILD === '1' && fs.existsSync(out)) {
  console.log(`sluice: keeping ${out}`);
  process.exit(0);
}

const sources = fs.existsSync(path.join(here, 'Cargo.toml'));
const prebuilt = addon.resolvePrebuilt();
if (prebuilt !== null && !(sources && fs.existsSync(out))) {
  console.log(`sluice: using the prebuilt addon ${prebuilt}`);
  process.exit(0);
}
if (!sources) {
  const name = addon.prebuiltPackage();
  console.error(
    name === null
      ? `sluice: there is no prebuilt addon for ${addon.platformTriple()}; build from source: ` +
          'npm install ./path/to/sluice/bindings/node (needs a Rust toolchain)'
      : `sluice: the prebuilt addon ${name} is missing (was it installed with --omit=optional?)`,
  );
  process.exit(1);
}

const profile = process.env.SLUICE_NODE_PROFILE === 'debug' ? 'debug' : 'release';
const cargo = process.env.CARGO || 'cargo';
const args = ['build', '-p', 'sluice-node', '--manifest-path', path.join(here, 'Cargo.toml')];
if (profile === 'release') args.push('--release');

let metadata;
try {
  metadata = JSON.parse(
    execFileSync(cargo, ['metadata', '--format-version', '1', '--no-deps', '--manifest-path', path.join(here, 'Cargo.toml')], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'inherit'],
    }),
  );
} catch (e) {
  console.error('sluice: building the addon needs cargo (a Rust toolchain, https://rustup.rs) on PATH');
  throw e;
}

console.log(`sluice: cargo ${args.join(' ')}`);
execFileSync(cargo, args, { stdio: 'inherit', cwd: here });

const libName = {
  linux: 'libsluice_node.so',
  darwin: 'libsluice_node.dylib',
  win32: 'sluice_node.dll',
}[process.platform] || 'libsluice_node.so';
const built = path.join(metadata.target_directory, profile, libName);
if (!fs.existsSync(built)) {
  throw new Error(`sluice: cargo finished but ${built} is missing`);
}
// Copy to a temporary name and rename, so a running process never loads half a file.
fs.copyFileSync(built, out + '.tmp');
fs.renameSync(out + '.tmp', out);
console.log(`sluice: built ${out} (${profile})`);
