// sluice for Node: the Rust limiter as an addon, with a JS surface shaped for Node code.
//
// Every decision is made by the Rust crates inside the addon; this file only makes the
// core registry's algorithms into constructors, checks option names and adds `release()` to
// results that hold concurrency leases. The middleware lives in lib/express.js and lib/fastify.js. Where the addon comes
// from is decided in lib/addon.js (built from source, or the prebuilt platform package).
'use strict';

const native = require('./lib/addon.js').load();

const NativePolicy = native.Policy;
const NativeLimiter = native.Limiter;

/** Options every algorithm takes (`mode` is the decision mode, `exact` or `leased`). */
const COMMON = ['failureMode', 'shadow', 'shards', 'mode', 'leaseTtl'];

/**
 * The algorithms, asked of the core registry (`algorithms()` in src/config.rs): one
 * constructor per algorithm, named after its stable name in camel case (`token-bucket` is
 * `Policy.tokenBucket`), taking the registry's parameters as options.
 */
const camel = (name) => name.replace(/-([a-z])/g, (_, c) => c.toUpperCase());
const ALGORITHMS = Object.fromEntries(native.algorithms().map((a) => [camel(a.name), [a.name, a.params]]));

/**
 * A sluice.toml that cannot be used: `message` has one `FILE:LINE: field: message` line per
 * problem, the lines `sluice validate` prints.
 */
class ConfigError extends Error {
  constructor(message) {
    super(message);
    this.name = 'ConfigError';
    this.code = 'ConfigError';
  }
}

/** Calls `f`, turning the addon's configuration errors into `ConfigError`s. */
function readingConfig(f) {
  try {
    return f();
  } catch (e) {
    const prefix = 'ConfigError: ';
    if (e && typeof e.message === 'string' && e.message.startsWith(prefix)) {
      throw new ConfigError(e.message.slice(prefix.length));
    }
    throw e;
  }
}

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
      const own = [...new Set([...ALGORITHMS[method][1], ...COMMON])].join(', ');
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
    known = policy.holdsLeases;
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

Object.defineProperty(NativePolicy, 'allFromToml', {
  /** Every `[policies.NAME]` of a TOML text (a whole sluice.toml works), by sluice's own reader. */
  value: (text, file) => readingConfig(() => native.policiesFromToml(text, file)),
  enumerable: true,
});
Object.defineProperty(NativePolicy, 'fromToml', {
  /** The one `[policies.NAME]` of a TOML text. */
  value: (text, file) => {
    const all = NativePolicy.allFromToml(text, file);
    if (all.length !== 1) {
      throw new ConfigError(`${file ?? '<inline>'}: the TOML holds ${all.length} policies; Policy.fromToml takes exactly one (Policy.allFromToml reads several)`);
    }
    return all[0];
  },
  enumerable: true,
});

/** A checked sluice.toml: `Config.load(path)` or `Config.parse(text, file)`. */
const NativeConfig = native.Config;
class Config {
  /** @param {object} inner the addon's configuration; use `Config.load` or `Config.parse`. */
  constructor(inner) {
    if (!(inner instanceof NativeConfig)) throw invalidArg('use Config.load(path) or Config.parse(text)');
    this.native = inner;
  }

  /** Reads and checks the file at `path` with sluice's own reader; throws `ConfigError`. */
  static load(path) {
    if (typeof path !== 'string') throw invalidArg('Config.load: path must be a string');
    return new Config(readingConfig(() => NativeConfig.load(path)));
  }

  /** Checks configuration text; `file` names it in errors (default `<inline>`). */
  static parse(text, file) {
    if (typeof text !== 'string') throw invalidArg('Config.parse: text must be a string');
    return new Config(readingConfig(() => NativeConfig.parse(text, file)));
  }

  /** The file it was read from (null for `Config.parse`). */
  get path() {
    return this.native.path;
  }

  /** Every `[policies.NAME]`: name -> Policy. */
  get policies() {
    return Object.fromEntries(this.native.policyList.map((p) => [p.name, p]));
  }

  /** `store.url` with any password hidden. */
  get storeUrl() {
    return this.native.storeUrl;
  }
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

/** Verdict names by the code the addon sends (src/limiter.rs, `Completed`). */
const VERDICTS = ['decided', 'failed_open', 'failed_closed'];
/**
 * Numbers per check in a delivered batch (src/limiter.rs, `Completed`): id, allowed,
 * remaining, limit, retryAfterMs, resetAfterMs, delayMs, verdict, then where the check's
 * headers, reason and lease token end in the batch's text.
 */
const NUMBERS_PER_CHECK = 11;
/** Numbers per check given to `submitMany`: id, policy index, cost, identity length. */
const SUBMITTED_PER_CHECK = 4;

/**
 * The answer to a check, made from the addon's compact batch. `headers` is built from its
 * text the first time it is read (most callers of `check` read only `allowed`): the batch's
 * texts cross from Rust as one string, and a result only remembers where its headers are.
 */
class Checked {
  #text;
  #from;
  #to;
  #headers;

  constructor(numbers, i, text, from) {
    const headersEnd = numbers[i + 8];
    const reasonEnd = numbers[i + 9];
    const leaseEnd = numbers[i + 10];
    this.allowed = numbers[i + 1] === 1;
    this.remaining = numbers[i + 2];
    this.limit = numbers[i + 3];
    this.retryAfterMs = numbers[i + 4];
    this.resetAfterMs = numbers[i + 5];
    this.delayMs = numbers[i + 6];
    this.verdict = VERDICTS[numbers[i + 7]];
    this.reason = reasonEnd > headersEnd ? text.slice(headersEnd, reasonEnd) : undefined;
    this.leaseToken = leaseEnd > reasonEnd ? text.slice(reasonEnd, leaseEnd) : undefined;
    this.#text = text;
    this.#from = from;
    this.#to = headersEnd;
    this.#headers = undefined;
  }

  /** `RateLimit-Policy`, `RateLimit` and, on a denial, `Retry-After` (name -> value). */
  get headers() {
    if (this.#headers === undefined) {
      const h = {};
      if (this.#to > this.#from) {
        const parts = this.#text.slice(this.#from, this.#to).split('\n');
        for (let k = 0; k + 1 < parts.length; k += 2) h[parts[k]] = parts[k + 1];
      }
      this.#headers = h;
      this.#text = undefined; // the batch's text is no longer held for this result
    }
    return this.#headers;
  }

  toJSON() {
    return { ...this, headers: this.headers };
  }
}

/**
 * The checks of one limiter that are in flight: their resolve functions by id. Results come
 * back from the addon in batches (one wake-up of the event loop for all the checks that
 * finished meanwhile), as one array of numbers and one of strings. The addon's delivery is
 * weak, so while checks are pending a timer keeps the process alive, as pending I/O would.
 */
class InFlight {
  constructor() {
    this.resolvers = new Map();
    this.nextId = 0;
    this.keepAlive = null;
    this.deliver = (batch) => {
      const { numbers, text } = batch;
      for (let i = 0, from = 0; i < numbers.length; from = numbers[i + 10], i += NUMBERS_PER_CHECK) {
        const id = numbers[i];
        const resolve = this.resolvers.get(id);
        if (resolve === undefined) continue;
        this.resolvers.delete(id);
        resolve(new Checked(numbers, i, text, from));
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
        start(id, reject);
      } catch (e) {
        reject(e);
        return;
      }
      this.resolvers.set(id, resolve);
      if (this.keepAlive === null) this.keepAlive = setInterval(noop, 1 << 30);
    });
  }

  /** Drops a check that never reached the addon. */
  forget(id) {
    this.resolvers.delete(id);
    if (this.resolvers.size === 0 && this.keepAlive !== null) {
      clearInterval(this.keepAlive);
      this.keepAlive = null;
    }
  }
}

/**
 * Identities of at most this many UTF-16 units are at most 512 UTF-8 bytes (the engine's
 * bound), so they can be sent in a batch; longer ones go alone, where the addon measures them.
 */
const MAX_FAST_IDENTITY = 170;

/** The cost of `options` when it is only `{ cost }` (a whole number) or `{}`, else undefined. */
function fastCost(options) {
  if (options === null || typeof options !== 'object' || options.credential !== undefined) return undefined;
  const c = options.cost;
  if (c === undefined) return 1;
  return Number.isSafeInteger(c) && c >= 0 ? c : undefined;
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
    // Checks of text identities wait here for the end of the current turn of the event loop,
    // then go to the addon in one call (`submitMany`): one crossing and one tokio task per
    // batch rather than per check.
    this.policyIds = new WeakMap();
    this.batch = null;
    this.flushBatch = () => this.flush();
  }

  /** The index `policy` is registered under for `submitMany`, or null (registry full). */
  policyId(policy) {
    let id = this.policyIds.get(policy);
    if (id === undefined) {
      id = this.native.registerPolicy(policy);
      this.policyIds.set(policy, id);
    }
    return id;
  }

  /**
   * A check queued for the next `submitMany`; a Promise of its result. The batch is kept as
   * the addon takes it: four numbers per check and the identities joined into one string
   * (cut apart again by their lengths), so it crosses as two values.
   */
  queue(policy, policyId, identity, cost) {
    let b = this.batch;
    if (b === null) {
      b = this.batch = { numbers: [], identities: '', policies: [], rejects: [] };
      queueMicrotask(this.flushBatch);
    }
    return this.inFlight.add((id, reject) => {
      b.numbers.push(id, policyId, cost, identity.length);
      b.identities += identity;
      b.policies.push(policy);
      b.rejects.push(reject);
    });
  }

  /** Sends the queued checks; if the addon refuses the batch, each alone (so only bad ones fail). */
  flush() {
    const b = this.batch;
    this.batch = null;
    if (b === null || b.policies.length === 0) return;
    try {
      this.native.submitMany(Float64Array.from(b.numbers), b.identities);
    } catch {
      for (let k = 0, at = 0; k < b.policies.length; k++) {
        const i = k * SUBMITTED_PER_CHECK;
        const [id, , cost, length] = b.numbers.slice(i, i + SUBMITTED_PER_CHECK);
        const identity = b.identities.slice(at, at + length);
        at += length;
        try {
          this.native.submit(id, b.policies[k], identity, { cost });
        } catch (e) {
          this.inFlight.forget(id);
          b.rejects[k](e);
        }
      }
    }
  }

  /** Connects to `memory` (default), `redis://`, `rediss://` or `redis+cluster://`. */
  static async connect(url = 'memory', options = undefined) {
    if (typeof url !== 'string') throw invalidArg('Limiter.connect: url must be a string such as "memory" or "redis://127.0.0.1:6379"');
    return new Limiter(await NativeLimiter.connect(url, options));
  }

  /**
   * The limiter a sluice.toml describes (a `Config` or a path): its store, timeouts, key
   * prefix, `identity_hash_key`, `legacy_headers` and the file's lists, plans and ban rules,
   * built by the code `sluice serve` uses.
   */
  static async fromConfig(config) {
    const c = typeof config === 'string' ? Config.load(config) : config;
    if (!(c instanceof Config)) throw invalidArg('Limiter.fromConfig: expected a Config or the path of a sluice.toml');
    return new Limiter(await NativeLimiter.fromConfig(c.native));
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
    let pending;
    const cost = options === undefined ? 1 : fastCost(options);
    const policyId = typeof identity === 'string' && cost !== undefined && identity.length > 0 &&
      identity.length <= MAX_FAST_IDENTITY ? this.policyId(policy) : null;
    if (policyId !== null) {
      pending = this.queue(policy, policyId, identity, cost);
    } else {
      const native = this.native;
      pending = this.inFlight.add((id) => native.submit(id, policy, identity ?? undefined, options));
    }
    // Only concurrency policies take leases; other results are passed on as they come.
    if (!leasing(policy)) return pending;
    return pending.then((r) => (r.leaseToken ? withRelease(this.native, policy, r) : r));
  }

  /**
   * Reserves `maxCost` of `policy` for `identity` (or `null` and `{ credential }`) until it is
   * settled with the real cost or `{ ttlMs }` ends (default 60000; then it counts in full).
   * Resolves to a `Reservation`: `allowed`, `id`, `maxCost`, `checked` and `settle(cost)`.
   */
  reserve(policy, identity, maxCost, options) {
    try {
      return this.native.reserve(policy, identity ?? undefined, maxCost, options);
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /** Settles the reservation `id` (made by any process sharing the store) with the real `cost`. */
  settle(id, cost) {
    try {
      return this.native.settle(id, cost);
    } catch (e) {
      return Promise.reject(e);
    }
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
  Config,
  ConfigError,
  Limiter,
  Policy: NativePolicy,
  HttpGuard: native.HttpGuard,
  Reservation: native.Reservation,
  native,
};
