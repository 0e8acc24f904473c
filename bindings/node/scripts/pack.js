#!/usr/bin/env node
// Packs the npm tarballs in the napi-rs layout: the `sluice` package (JavaScript, types, the
// install script) and the platform package `sluice-linux-x64-gnu` (the compiled addon).
//
//   node scripts/pack.js --addon target/release/libsluice_node.so --out dist
//
// The main package's `optionalDependencies` name the platform package at the same version;
// they are added here, when packing (as `napi prepublish` does), so that installing from
// the repository (`npm install ./bindings/node`) never asks the registry for it. Each package
// is copied to a staging folder and packed there with `npm pack`; the tarballs' names are
// printed, one a line.
'use strict';

const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const here = path.resolve(__dirname, '..');

function args() {
  const a = { addon: null, out: null };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '');
    if (!(key in a) || argv[i + 1] === undefined) throw new Error(`pack.js: unknown or incomplete argument ${argv[i]}`);
    a[key] = path.resolve(argv[i + 1]);
  }
  if (a.addon === null || a.out === null) throw new Error('usage: pack.js --addon LIB --out DIR');
  return a;
}

function readJson(file) {
  return JSON.parse(fs.readFileSync(file, 'utf8'));
}

/** Copies `from` (a file or a folder) to `to`. */
function copy(from, to) {
  fs.cpSync(from, to, { recursive: true });
}

function pack(dir, out) {
  const json = execFileSync('npm', ['pack', '--json', '--pack-destination', out], {
    cwd: dir,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  return JSON.parse(json)[0].filename;
}

function main() {
  const { addon, out } = args();
  fs.mkdirSync(out, { recursive: true });
  const main = readJson(path.join(here, 'package.json'));
  const platformDir = path.join(here, 'npm', 'linux-x64-gnu');
  const platform = readJson(path.join(platformDir, 'package.json'));
  if (platform.version !== main.version) {
    throw new Error(`pack.js: ${platform.name} is at ${platform.version}, sluice at ${main.version}`);
  }
  const staging = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-pack-'));
  try {
    // The platform package: its package.json and README, and the addon under its napi-rs name.
    const p = path.join(staging, 'platform');
    fs.mkdirSync(p);
    copy(path.join(platformDir, 'package.json'), path.join(p, 'package.json'));
    copy(path.join(platformDir, 'README.md'), path.join(p, 'README.md'));
    copy(addon, path.join(p, platform.main));

    // The main package: the files its package.json lists, and the optional dependency.
    const m = path.join(staging, 'main');
    fs.mkdirSync(m);
    for (const f of main.files) copy(path.join(here, f), path.join(m, f));
    main.optionalDependencies = { [platform.name]: platform.version };
    delete main.scripts.test; // the tests stay in the repository
    fs.writeFileSync(path.join(m, 'package.json'), JSON.stringify(main, null, 2) + '\n');

    console.log(pack(p, out));
    console.log(pack(m, out));
  } finally {
    fs.rmSync(staging, { recursive: true, force: true });
  }
}

main();
