import type { RateLimitOptions } from './index';

/**
 * Fastify plugin (not encapsulated: it limits every route of the app it is registered on).
 * Decorates requests with `sluiceIdentity`.
 */
declare function sluice(fastify: any, options: RateLimitOptions): Promise<void>;
export = sluice;
