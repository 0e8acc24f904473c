// Fastify plugin: `await app.register(sluice, { limiter, policies, ... })`.
//
// An `onRequest` hook hands the method, URL, raw headers and socket peer to the Rust
// HttpGuard (the decision function of the Rust layer and the proxy); a refusal is answered
// there (429, 403 for a deny-listed client, the fail-closed status, 400; the guard's headers
// and problem+json body). An admitted request is settled by its status in `onSend`, which
// sets the RateLimit fields. The plugin is not encapsulated (like fastify-plugin does it),
// so it limits every route of the app it is registered on.
//
// Fastify has matched the route before `onRequest` runs. When the guard normalized the path
// (`/%6cogin`, `//login`, `/a/../login` are all `/login`), the request is routed again with
// the normal form, as `sluice serve`'s proxy forwards it, so the handler that runs is the one
// for the path that was limited; the second pass carries the first one's verdict (one check).
'use strict';

const { guardFactory, releaseOnClose } = require('./guard');

/** The verdict of a request routed again with its normalized path. */
const DECIDED = Symbol('sluice.decided');

async function sluicePlugin(fastify, options) {
  const guardOf = guardFactory(options);
  fastify.decorateRequest('sluiceIdentity', null);
  fastify.decorateRequest('sluiceTicket', null);
  fastify.addHook('onRequest', async (request, reply) => {
    const guard = await guardOf();
    const raw = request.raw;
    let verdict = raw[DECIDED];
    if (verdict === undefined) {
      verdict = await guard.decide(raw.method, raw.url, raw.rawHeaders, raw.socket.remoteAddress ?? null);
      if (verdict.allowed && verdict.path != null) {
        const q = raw.url.indexOf('?');
        raw.url = verdict.path + (q >= 0 ? raw.url.slice(q) : '');
        raw[DECIDED] = verdict;
        reply.hijack();
        fastify.routing(raw, reply.raw);
        return reply;
      }
    }
    if (verdict.identity != null) request.sluiceIdentity = verdict.identity;
    if (!verdict.allowed) {
      const h = verdict.headers;
      for (let i = 0; i < h.length; i += 2) reply.header(h[i], h[i + 1]);
      reply.code(verdict.status);
      // A Buffer, so the content type stays exactly the guard's (no added charset).
      return reply.send(Buffer.from(verdict.body));
    }
    if (verdict.ticket != null) {
      request.sluiceTicket = { guard, ticket: verdict.ticket };
      releaseOnClose(guard, verdict, reply.raw);
    }
  });
  fastify.addHook('onSend', async (request, reply, payload) => {
    const t = request.sluiceTicket;
    if (!t) return payload;
    request.sluiceTicket = null;
    const finished = t.guard.finishNow(t.ticket, reply.statusCode) ?? (await t.guard.finish(t.ticket, reply.statusCode));
    const h = finished.headers;
    for (let i = 0; i < h.length; i += 2) reply.header(h[i], h[i + 1]);
    return payload;
  });
}

// What fastify-plugin sets: hooks apply to the whole app, not a child context.
sluicePlugin[Symbol.for('skip-override')] = true;
sluicePlugin[Symbol.for('fastify.display-name')] = 'sluice';
sluicePlugin[Symbol.for('plugin-meta')] = { name: 'sluice', fastify: '>=4' };

module.exports = sluicePlugin;
module.exports.default = sluicePlugin;
module.exports.sluice = sluicePlugin;
