// Express middleware: `app.use(rateLimit({ limiter, policies, ... }))`.
//
// For each request it hands the method, the full target (`req.originalUrl`, so rules match
// the same paths wherever the middleware is mounted), the raw headers and the socket peer
// to the Rust HttpGuard (the decision function of the Rust layer and the proxy), then either
// answers with the guard's refusal (429, 403 for a deny-listed client, the fail-closed
// status, 400; its headers and problem+json body) or passes the request on, settling it by
// its response status before the head is written and setting the RateLimit fields then.
// The request goes on with the path it was limited as: when the guard normalized it
// (`/%6cogin`, `//login`, `/a/../login` are all `/login`), `req.url` is rewritten to the
// normal form before the app's routes match, as `sluice serve`'s proxy forwards it.
// `rateLimit({ config: 'sluice.toml' })` limits the file's routes as `sluice serve` does.
'use strict';

const { guardFactory, releaseOnClose, settleBeforeHead, setHeaders } = require('./guard');

function rateLimit(options) {
  const guardOf = guardFactory(options);
  return function sluiceRateLimit(req, res, next) {
    let decided;
    try {
      const g = guardOf();
      decided =
        typeof g.then === 'function'
          ? g.then((guard) => decide(guard, req).then((v) => [guard, v]))
          : decide(g, req).then((v) => [g, v]);
    } catch (e) {
      next(e);
      return;
    }
    decided.then(([guard, verdict]) => {
      if (verdict.identity != null) req.sluiceIdentity = verdict.identity;
      if (!verdict.allowed) {
        res.statusCode = verdict.status;
        setHeaders(res, verdict.headers);
        res.end(verdict.body);
        return;
      }
      if (verdict.ticket != null) {
        settleBeforeHead(guard, verdict.ticket, res);
        releaseOnClose(guard, verdict, res);
      }
      if (verdict.path != null) useNormalizedPath(req, verdict.path);
      next();
    }, next);
  };
}

function decide(guard, req) {
  return guard.decide(req.method, req.originalUrl || req.url, req.rawHeaders, req.socket.remoteAddress ?? null);
}

/**
 * Routes the rest of the app on `path`, the normal form of the full path the guard limited:
 * `req.url` (relative to where the middleware is mounted) and `req.originalUrl`, the query
 * kept. A path that left the mount point (`/api/../admin` under `/api`) is not the mounted
 * router's to serve: it goes on as `/` there, never as a spelling the guard did not limit.
 */
function useNormalizedPath(req, path) {
  const url = req.url;
  const q = url.indexOf('?');
  const query = q >= 0 ? url.slice(q) : '';
  const base = req.baseUrl || '';
  let local = path;
  if (base) {
    local = path === base || path.startsWith(base + '/') ? path.slice(base.length) || '/' : '/';
  }
  req.url = local + query;
  req.originalUrl = path + query;
}

module.exports = { rateLimit };
module.exports.default = rateLimit;
