// The part the Express middleware and the Fastify plugin share: options (or a sluice.toml)
// into an HttpGuard (the Rust layer's decision function), settling an admitted request by
// its response status, and its ticket released when the response ends. No decision is made
// here.
'use strict';

const { Config, Limiter, Policy, HttpGuard } = require('..');

const OPTION_NAMES = new Set([
  'config',
  'limiter',
  'rules',
  'policies',
  'apiKeyHeader',
  'bearer',
  'trustedProxies',
  'ipv6Prefix',
  'ipv4Prefix',
  'hashKey',
  'ratelimitHeaders',
  'legacyHeaders',
  'failClosedStatus',
]);

function invalidArg(message) {
  const err = new TypeError(message);
  err.code = 'InvalidArg';
  return err;
}

/**
 * The rules of the options: `rules` (`{ prefix, methods?, policies, cost? }`, longest prefix
 * first, a rule without policies exempts its prefix) plus `policies` as a rule for `/`.
 */
function rulesOf(options) {
  const rules = [...(options.rules || [])];
  if (options.policies) rules.push({ prefix: '/', policies: options.policies });
  if (rules.length === 0) throw invalidArg('sluice middleware: give `policies` or `rules`');
  for (const r of rules) {
    if (typeof r.prefix !== 'string') throw invalidArg('sluice middleware: every rule needs a `prefix` such as "/api"');
    for (const p of r.policies || []) {
      if (!(p instanceof Policy)) throw invalidArg(`sluice middleware: rule ${r.prefix}: policies must be Policy objects`);
    }
  }
  return rules;
}

/**
 * The guard of a sluice.toml (`config`: a Config or a path): the file's routes, limited as
 * `sluice serve` limits them, on `limiter` or else the file's own limiter.
 */
function configGuardFactory(options) {
  for (const k of Object.keys(options)) {
    if (k !== 'config' && k !== 'limiter') {
      throw invalidArg(`sluice middleware: with \`config\`, the routes, identities and headers come from the file (${JSON.stringify(k)} does not apply)`);
    }
  }
  const config = typeof options.config === 'string' ? Config.load(options.config) : options.config;
  if (!(config instanceof Config)) throw invalidArg('sluice middleware: `config` must be a Config or the path of a sluice.toml');
  const limiter = options.limiter ?? Limiter.fromConfig(config);
  const build = (l) => {
    if (!(l instanceof Limiter)) throw invalidArg('sluice middleware: `limiter` must be a Limiter');
    return HttpGuard.fromConfig(l.native, config.native);
  };
  if (limiter instanceof Limiter) {
    const guard = build(limiter);
    return () => guard;
  }
  let pending = null;
  return () => (pending ??= Promise.resolve(limiter).then(build));
}

/** Builds the guard once the limiter is there (`limiter` may be a Promise of one). */
function guardFactory(options) {
  if (!options || typeof options !== 'object') throw invalidArg('sluice middleware: options are required');
  for (const k of Object.keys(options)) {
    if (!OPTION_NAMES.has(k)) throw invalidArg(`sluice middleware: unknown option ${JSON.stringify(k)}`);
  }
  if (options.config !== undefined) return configGuardFactory(options);
  const rules = rulesOf(options);
  const { limiter, rules: _r, policies: _p, ...guardOptions } = options;
  if (!limiter) throw invalidArg('sluice middleware: `limiter` is required (await Limiter.connect(url))');
  const build = (l) => {
    if (!(l instanceof Limiter)) throw invalidArg('sluice middleware: `limiter` must be a Limiter');
    const guard = new HttpGuard(l.native, guardOptions);
    for (const r of rules) {
      guard.addRule(r.prefix, r.methods ?? null, r.policies || [], r.cost ?? 1);
    }
    return guard;
  };
  if (limiter instanceof Limiter) {
    const guard = build(limiter);
    return () => guard;
  }
  let pending = null;
  return () => (pending ??= Promise.resolve(limiter).then(build));
}

/** Sets `[name, value, ...]` on a response. */
function setHeaders(res, flat) {
  for (let i = 0; i < flat.length; i += 2) res.setHeader(flat[i], flat[i + 1]);
}

/**
 * Settles an admitted request by its status before its head is written: at the first
 * `writeHead`, `write` or `end`, at once when the route counts every request, otherwise
 * queued until `guard.finish` (a refund in the store) is done, so the RateLimit fields set
 * then describe the state after the refund.
 */
function settleBeforeHead(guard, ticket, res) {
  const original = { writeHead: res.writeHead, write: res.write, end: res.end };
  const queued = [];
  let state = 'open';
  const restore = () => {
    res.writeHead = original.writeHead;
    res.write = original.write;
    res.end = original.end;
  };
  // A route counting every request settles without a store call: at once.
  const settledNow = () => {
    const finished = guard.finishNow(ticket, res.statusCode);
    if (finished === null) return false;
    if (!res.headersSent) setHeaders(res, finished.headers);
    state = 'done';
    restore();
    return true;
  };
  const settle = () => {
    state = 'settling';
    guard.finish(ticket, res.statusCode).then(
      (finished) => {
        if (!res.headersSent) setHeaders(res, finished.headers);
      },
      () => {
        // Not settled (the store failed): the request keeps its charge and gets no fields.
      },
    ).finally(() => {
      state = 'done';
      restore();
      for (const [fn, args] of queued) fn.apply(res, args);
    });
  };
  res.writeHead = function (statusCode, ...rest) {
    if (state === 'open') res.statusCode = statusCode;
    if (state === 'done' || (state === 'open' && settledNow())) return original.writeHead.call(this, statusCode, ...rest);
    queued.push([original.writeHead, [statusCode, ...rest]]);
    if (state === 'open') settle();
    return this;
  };
  res.write = function (...args) {
    if (state === 'done' || (state === 'open' && settledNow())) return original.write.apply(this, args);
    queued.push([original.write, args]);
    if (state === 'open') settle();
    return true;
  };
  res.end = function (...args) {
    if (state === 'done' || (state === 'open' && settledNow())) return original.end.apply(this, args);
    queued.push([original.end, args]);
    if (state === 'open') settle();
    return this;
  };
}

/** Ends a verdict's ticket when the response is over (sent or aborted): leases released. */
function releaseOnClose(guard, verdict, res) {
  const ticket = verdict.ticket;
  if (ticket === null || ticket === undefined) return;
  res.once('close', () => {
    guard.release(ticket).catch(() => {
      // An unreleased lease expires after the policy's lease timeout.
    });
  });
}

module.exports = { guardFactory, releaseOnClose, settleBeforeHead, setHeaders, invalidArg };
