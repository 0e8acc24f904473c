import type { RateLimitOptions } from './index';
import type { IncomingMessage, ServerResponse } from 'node:http';

/**
 * Express middleware. Sets `req.sluiceIdentity` (the identity the request was limited as)
 * and the RateLimit headers, or answers the refusal itself (429, 403 for a deny-listed
 * client, the fail-closed status, 400).
 */
export declare function rateLimit(
  options: RateLimitOptions,
): (req: IncomingMessage & { originalUrl?: string; sluiceIdentity?: string }, res: ServerResponse, next: (err?: unknown) => void) => void;
export default rateLimit;
