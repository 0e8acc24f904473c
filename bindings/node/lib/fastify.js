// Fastify plugin: `await app.register(sluice, { limiter, policies, ... })`.
//
// An `onRequest` hook hands the method, URL, raw headers and socket peer to the Rust
// HttpGuard; a denial is answered there (429 or the fail-closed status, the guard's headers
// and problem+json body), otherwise the RateLimit headers are set on the reply. The plugin
// is not encapsulated (like fastify-plugin does it), so it limits every route of the app it
// is registered on.
'use strict';

const { guardFactory, releaseOnClose } = require('./guard');

async function sluicePlugin(fastify, options) {
  const guardOf = guardFactory(options);
  fastify.decorateRequest('sluiceIdentity', null);
  fastify.addHook('onRequest', async (request, reply) => {
    const guard = await guardOf();
    const raw = request.raw;
    const verdict = await guard.decide(raw.method, raw.url, raw.rawHeaders, raw.socket.remoteAddress ?? null);
    if (verdict.identity !== undefined) request.sluiceIdentity = verdict.identity;
    releaseOnClose(guard, verdict, reply.raw);
    const h = verdict.headers;
    for (let i = 0; i < h.length; i += 2) reply.header(h[i], h[i + 1]);
    if (!verdict.allowed) {
      reply.code(verdict.status);
      // A Buffer, so the content type stays exactly the guard's (no added charset).
      return reply.send(Buffer.from(verdict.body));
    }
  });
}

// What fastify-plugin sets: hooks apply to the whole app, not a child context.
sluicePlugin[Symbol.for('skip-override')] = true;
sluicePlugin[Symbol.for('fastify.display-name')] = 'sluice';
sluicePlugin[Symbol.for('plugin-meta')] = { name: 'sluice', fastify: '>=4' };

module.exports = sluicePlugin;
module.exports.default = sluicePlugin;
module.exports.sluice = sluicePlugin;
