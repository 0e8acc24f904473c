// The part the Express middleware and the Fastify plugin share: options into an HttpGuard
// (the Rust layer's rules, identities and answers), and leases released when a response
// ends. No decision is made here.
'use strict';

const { Limiter, Policy, HttpGuard } = require('..');

const OPTION_NAMES = new Set([
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

/** Builds the guard once the limiter is there (`limiter` may be a Promise of one). */
function guardFactory(options) {
  if (!options || typeof options !== 'object') throw invalidArg('sluice middleware: options are required');
  for (const k of Object.keys(options)) {
    if (!OPTION_NAMES.has(k)) throw invalidArg(`sluice middleware: unknown option ${JSON.stringify(k)}`);
  }
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

/** Releases a verdict's leases when the response is over (sent or aborted). */
function releaseOnClose(guard, verdict, res) {
  if (!verdict.leaseToken) return;
  res.once('close', () => {
    guard.release(verdict.leaseToken).catch(() => {
      // An unreleased lease expires after the policy's lease timeout.
    });
  });
}

module.exports = { guardFactory, releaseOnClose, invalidArg };
