// Where the compiled addon comes from, in the napi-rs layout.
//
// Two ways to get it: built from source in the sluice workspace (`scripts/build.js` writes
// `sluice.node` next to index.js), or prebuilt in a platform package (`sluice-linux-x64-gnu`)
// that npm installs through the main package's `optionalDependencies` on matching machines
// only. A source build wins when both are there, so a developer's fresh build is what runs.
'use strict';

const fs = require('node:fs');
const path = require('node:path');

const root = path.resolve(__dirname, '..');
/** The addon a source build writes. */
const localAddon = path.join(root, 'sluice.node');

/** `linux-x64-gnu`, `linux-x64-musl`, `darwin-arm64`...: the napi-rs name of this platform. */
function platformTriple() {
  const { platform, arch } = process;
  if (platform !== 'linux') return `${platform}-${arch}`;
  const report = process.report && typeof process.report.getReport === 'function' ? process.report.getReport() : null;
  const glibc = report && report.header && report.header.glibcVersionRuntime;
  return `linux-${arch}-${glibc ? 'gnu' : 'musl'}`;
}

/** The platform packages that exist, by platform (see npm/ and scripts/package). */
const PREBUILT = {
  'linux-x64-gnu': 'sluice-linux-x64-gnu',
};

/** The platform package for this machine, or null when there is none. */
function prebuiltPackage() {
  return PREBUILT[platformTriple()] || null;
}

/** The path of the installed prebuilt addon, or null (no package for this platform, or not installed). */
function resolvePrebuilt() {
  const name = prebuiltPackage();
  if (name === null) return null;
  try {
    return require.resolve(name, { paths: [root] });
  } catch {
    return null;
  }
}

/** Loads the addon: the source build if there is one, else the prebuilt platform package. */
function load() {
  const tried = [];
  if (fs.existsSync(localAddon)) {
    try {
      return require(localAddon);
    } catch (e) {
      tried.push(`${localAddon}: ${e.message}`);
    }
  }
  const prebuilt = resolvePrebuilt();
  if (prebuilt !== null) {
    try {
      return require(prebuilt);
    } catch (e) {
      tried.push(`${prebuilt}: ${e.message}`);
    }
  } else {
    const name = prebuiltPackage();
    tried.push(name === null
      ? `no prebuilt addon for ${platformTriple()} (there is one for ${Object.keys(PREBUILT).join(', ')})`
      : `${name} is not installed (npm skips optional dependencies with --omit=optional)`);
  }
  const err = new Error(
    `sluice: cannot load the addon (${tried.join('; ')}); ` +
      'build it from source with `npm install` in bindings/node, or `node bindings/node/scripts/build.js`',
  );
  err.code = 'ERR_SLUICE_ADDON';
  throw err;
}

module.exports = { load, localAddon, platformTriple, prebuiltPackage, resolvePrebuilt };
