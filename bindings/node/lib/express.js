// Express middleware: `app.use(rateLimit({ limiter, policies, ... }))`.
//
// For each request it hands the method, the full path (`req.originalUrl`, so rules match
// the same paths wherever the middleware is mounted), the raw headers and the socket peer
// to the Rust HttpGuard, then passes the request on with the RateLimit headers set, or
// answers it with the guard's 429 (or fail-closed 503), headers and problem+json body.
'use strict';

const { guardFactory, releaseOnClose } = require('./guard');

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
      if (verdict.identity !== undefined) req.sluiceIdentity = verdict.identity;
      const h = verdict.headers;
      if (!verdict.allowed) {
        res.statusCode = verdict.status;
        for (let i = 0; i < h.length; i += 2) res.setHeader(h[i], h[i + 1]);
        res.end(verdict.body);
        releaseOnClose(guard, verdict, res);
        return;
      }
      for (let i = 0; i < h.length; i += 2) res.setHeader(h[i], h[i + 1]);
      releaseOnClose(guard, verdict, res);
      next();
    }, next);
  };
}

function decide(guard, req) {
  return guard.decide(req.method, req.originalUrl || req.url, req.rawHeaders, req.socket.remoteAddress ?? null);
}

module.exports = { rateLimit };
module.exports.default = rateLimit;
