// sluice for Node: the Rust limiter as an addon, with a JS surface shaped for Node code.
//
// Every decision is made by the Rust crates inside `sluice.node` (built by
// scripts/build.js); this file only names the algorithms, checks option names and adds
// `release()` to results that hold concurrency leases. The middleware lives in
// lib/express.js and lib/fastify.js.
'use strict';

const path = require('node:path');

let native;
try {
  native = require(path.join(__dirname, 'sluice.node'));
} catch (e) {
  const err = new Error(
    `sluice: cannot load ${path.join(__dirname, 'sluice.node')} (${e.message}); ` +
      'build it with `npm install` in bindings/node, or `node bindings/node/scripts/build.js`',
  );
  err.code = 'ERR_SLUICE_ADDON';
  throw err;
}

const NativePolicy = native.Policy;
const NativeLimiter = native.Limiter;

/** Options every algorithm takes, and the algorithm's own, by registry name. */
const COMMON = ['failureMode', 'shadow', 'shards'];
const ALGORITHMS = {
  tokenBucket: ['token-bucket', ['capacity', 'rate']],
  gcra: ['gcra', ['rate', 'burst']],
  leakyBucket: ['leaky-bucket', ['capacity', 'rate', 'mode']],
  fixedWindow: ['fixed-window', ['limit', 'window']],
  slidingCounter: ['sliding-window-counter', ['limit', 'window']],
  slidingLog: ['sliding-window-log', ['limit', 'window']],
  concurrency: ['concurrency', ['limit', 'lease']],
};

function invalidArg(message) {
  const err = new TypeError(message);
  err.code = 'InvalidArg';
  return err;
}

/**
 * Refuses option names the algorithm does not know, so a typo (`capcity`) is an error
 * rather than a default. Parameters of other algorithms are passed on: the core registry
 * refuses them with its own words ("gcra takes no capacity").
 */
function checkOptionNames(method, options) {
  if (options === undefined || options === null) return {};
  if (typeof options !== 'object') throw invalidArg(`Policy.${method}: options must be an object`);
  const known = new Set(COMMON);
  for (const [, params] of Object.values(ALGORITHMS)) for (const p of params) known.add(p);
  for (const k of Object.keys(options)) {
    if (!known.has(k)) {
      const own = [...ALGORITHMS[method][1], ...COMMON].join(', ');
      throw invalidArg(`Policy.${method}: unknown option ${JSON.stringify(k)} (it takes ${own})`);
    }
  }
  return options;
}

/** Whether a policy's checks take leases (asked once per policy, then remembered). */
const takesLeases = new WeakMap();
function leasing(policy) {
  let known = takesLeases.get(policy);
  if (known === undefined) {
    known = policy.algorithm === 'concurrency';
    takesLeases.set(policy, known);
  }
  return known;
}

for (const [method, [algorithm]] of Object.entries(ALGORITHMS)) {
  Object.defineProperty(NativePolicy, method, {
    value: function (name, options) {
      if (typeof name !== 'string') throw invalidArg(`Policy.${method}: the first argument is the policy name`);
      return NativePolicy.create(algorithm, name, checkOptionNames(method, options));
    },
    enumerable: true,
  });
}

/** Adds `release()` to a check result holding concurrency leases. */
function withRelease(native, policy, result) {
  const token = result.leaseToken;
  let released = false;
  Object.defineProperty(result, 'release', {
    value: () => {
      if (!token || released) return Promise.resolve(0);
      released = true;
      return native.release(policy, token);
    },
    enumerable: false,
  });
  return result;
}

const noop = () => {};

/**
 * The checks of one limiter that are in flight: their resolve functions by id. Results come
 * back from the addon in batches (one wake-up of the event loop for all the checks that
 * finished meanwhile). The addon's delivery is weak, so while checks are pending a timer
 * keeps the process alive, as pending I/O would.
 */
class InFlight {
  constructor() {
    this.resolvers = new Map();
    this.nextId = 0;
    this.keepAlive = null;
    this.deliver = (batch) => {
      for (let i = 0; i < batch.length; i++) {
        const { id, result } = batch[i];
        const resolve = this.resolvers.get(id);
        if (resolve === undefined) continue;
        this.resolvers.delete(id);
        resolve(result);
      }
      if (this.resolvers.size === 0 && this.keepAlive !== null) {
        clearInterval(this.keepAlive);
        this.keepAlive = null;
      }
    };
  }

  /** An id for a new check, and a Promise settled when `deliver` gets its result. */
  add(start) {
    return new Promise((resolve, reject) => {
      const id = (this.nextId = (this.nextId + 1) >>> 0);
      try {
        start(id);
      } catch (e) {
        reject(e);
        return;
      }
      this.resolvers.set(id, resolve);
      if (this.keepAlive === null) this.keepAlive = setInterval(noop, 1 << 30);
    });
  }
}

/** A rate limiter on one store: `await Limiter.connect(url, options)`. */
class Limiter {
  /** @param {object} inner the addon's limiter; use `Limiter.connect`. */
  constructor(inner) {
    if (!(inner instanceof NativeLimiter)) throw invalidArg('use `await Limiter.connect(url)`');
    this.native = inner;
    // The delivery function holds the in-flight table only, never this object, so a limiter
    // nobody references is collected with its connection.
    this.inFlight = new InFlight();
    inner.deliverTo(this.inFlight.deliver);
  }

  /** Connects to `memory` (default), `redis://`, `rediss://` or `redis+cluster://`. */
  static async connect(url = 'memory', options = undefined) {
    if (typeof url !== 'string') throw invalidArg('Limiter.connect: url must be a string such as "memory" or "redis://127.0.0.1:6379"');
    return new Limiter(await NativeLimiter.connect(url, options));
  }

  /**
   * Checks `policy` for `identity` (or `{ credential }`, hashed) at `{ cost }`. Resolves to
   * `{ allowed, remaining, limit, retryAfterMs, resetAfterMs, headers, ... }`; never rejects
   * for a store failure (the policy's failure mode decides and `verdict` says so).
   */
  check(policy, identity, options) {
    if (identity !== null && typeof identity === 'object' && options === undefined) {
      options = identity;
      identity = undefined;
    }
    if (!(policy instanceof NativePolicy)) {
      return Promise.reject(invalidArg('check: the first argument must be a Policy'));
    }
    const native = this.native;
    const pending = this.inFlight.add((id) => native.submit(id, policy, identity ?? undefined, options));
    // Only concurrency policies take leases; other results are passed on as they come.
    if (!leasing(policy)) return pending;
    return pending.then((r) => (r.leaseToken ? withRelease(this.native, policy, r) : r));
  }

  /** Gives back the leases of a check result's `leaseToken` (from another process too). */
  release(policy, leaseToken) {
    return this.native.release(policy, leaseToken);
  }

  /** The identity a credential is limited as (`key:h<hex>`), as the Rust layer and `sluice serve` make it. */
  credentialIdentity(credential) {
    return this.native.credentialIdentity(credential);
  }

  /** The store key a policy keeps an identity's state under. */
  key(policy, identity) {
    return this.native.key(policy, identity);
  }

  get store() {
    return this.native.store;
  }

  get circuitOpen() {
    return this.native.circuitOpen;
  }

  get denyCacheHits() {
    return this.native.denyCacheHits;
  }
}

module.exports = {
  Limiter,
  Policy: NativePolicy,
  HttpGuard: native.HttpGuard,
  native,
};
