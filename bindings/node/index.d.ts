// Types of the sluice package (hand-written; the runtime is index.js over sluice.node).

/** A duration: `"500ms"`, `"10s"`, `"1m"`, `"1h"`, `"1d"`, or a number of seconds. */
export type Duration = string | number;

/** What to do when the store fails: admit, deny, or decide from a local embedded store. */
export type FailureMode = 'open' | 'closed' | 'local';

/** Options every algorithm takes. */
export interface CommonOptions {
  /** Default `"open"`. */
  failureMode?: FailureMode;
  /** Count decisions but never deny (default false). */
  shadow?: boolean;
  /** Split each identity's state over this many keys (hot keys on Redis Cluster; default 1). */
  shards?: number;
  /**
   * `"exact"` (default: one store call per check) or `"leased"`: the instance takes slices of
   * the quota in one store call and spends them locally; never admits more than the limit,
   * may under-admit by what other instances hold (token bucket, GCRA, fixed window only).
   */
  mode?: DecisionMode;
  /** Leased mode: the longest a slice is spent before it goes back (default `"1s"`, at most `"60s"`). */
  leaseTtl?: Duration;
}

/** How an instance decides a policy's checks. */
export type DecisionMode = 'exact' | 'leased';

export interface TokenBucketOptions extends CommonOptions {
  capacity: number;
  /** Refill rate such as `"5/s"`, `"300/min"`, `"10/2s"`. */
  rate: string;
}
export interface GcraOptions extends CommonOptions {
  /** Emission rate such as `"5/s"`. */
  rate: string;
  /** Extra requests beyond the steady rate (default 0). */
  burst?: number;
}
export interface LeakyBucketOptions extends Omit<CommonOptions, 'mode'> {
  capacity: number;
  /** Drain rate such as `"5/s"`. */
  rate: string;
  /** `"policing"` (default: deny when full) or `"shaping"` (delay); or a decision mode. */
  mode?: 'policing' | 'shaping' | DecisionMode;
}
export interface WindowOptions extends CommonOptions {
  limit: number;
  window: Duration;
}
export interface ConcurrencyOptions extends CommonOptions {
  /** Requests in flight at once. */
  limit: number;
  /** How long a lease that is never released lives (default `"30s"`). */
  lease?: Duration;
}

/** A named limit. Built by one constructor per algorithm; bad options throw (`code: 'InvalidArg'`). */
export declare class Policy {
  private constructor();
  static tokenBucket(name: string, options: TokenBucketOptions): Policy;
  static gcra(name: string, options: GcraOptions): Policy;
  static leakyBucket(name: string, options: LeakyBucketOptions): Policy;
  static fixedWindow(name: string, options: WindowOptions): Policy;
  static slidingCounter(name: string, options: WindowOptions): Policy;
  static slidingLog(name: string, options: WindowOptions): Policy;
  static concurrency(name: string, options: ConcurrencyOptions): Policy;
  /** Any algorithm by its registry name (`token-bucket`, `sliding-log`, ...). */
  static create(algorithm: string, name: string, options?: object): Policy;
  /** Every `[policies.NAME]` of a TOML text (a whole sluice.toml works), in name order; throws `ConfigError`. */
  static allFromToml(text: string, file?: string): Policy[];
  /** The one `[policies.NAME]` of a TOML text; throws `ConfigError`. */
  static fromToml(text: string, file?: string): Policy;
  readonly name: string;
  /** `token-bucket`, `gcra`, `leaky-bucket`, `fixed-window`, `sliding-counter`, `sliding-log` or `concurrency`. */
  readonly algorithm: string;
  /** The quota shown to clients (`q` of `RateLimit-Policy`). */
  readonly quota: number;
  /** The window shown to clients, in ms. */
  readonly windowMs: number;
  /** True when checks take leases that `release` gives back (concurrency). */
  readonly holdsLeases: boolean;
  readonly failureMode: FailureMode;
  readonly shadow: boolean;
  readonly shards: number;
  /** `"exact"` or `"leased"`. */
  readonly decisionMode: DecisionMode;
  /** Leased mode: the longest a slice is spent, in ms (`null` in exact mode). */
  readonly leaseTtlMs: number | null;
}

export interface ConnectOptions {
  /** Bound of every store call, in ms (default 50). */
  timeoutMs?: number;
  /** Embedded store: the most keys tracked before eviction (default 1,000,000). */
  maxKeys?: number;
  /** Embedded store: the most bytes allocated before eviction (default unbounded). */
  maxMemory?: number;
  /** 64 hex digits: the `identity_hash_key` shared with the other services (credentials). */
  hashKey?: string;
  /** Also give `X-RateLimit-Limit`, `-Remaining`, `-Reset` in `headers`. */
  legacyHeaders?: boolean;
}

export interface CheckOptions {
  /** What the request costs (default 1). */
  cost?: number;
  /** An API key or other secret to limit by, hashed into `key:h<hex>` first. */
  credential?: string | Buffer;
}

/** The answer to a check. */
export interface Checked {
  /** Whether to let the request through (shadow denials and fail-open admit). */
  allowed: boolean;
  /** How many more cost-1 requests would be admitted now. */
  remaining: number;
  /** The policy's quota (0 when the store failed). */
  limit: number;
  /** How long to wait before retrying, in ms (0 when admitted). */
  retryAfterMs: number;
  /** How long until the limit is back to full, in ms. */
  resetAfterMs: number;
  /** A shaping leaky bucket's delay before passing the request on, in ms. */
  delayMs: number;
  verdict: 'decided' | 'failed_open' | 'failed_closed';
  /** Why it was denied: `limited`, `cost_exceeds_limit`, `store_unavailable`, ... */
  reason?: string;
  /** `RateLimit-Policy`, `RateLimit` and, on a denial, `Retry-After`. */
  headers: Record<string, string>;
  /** The concurrency leases taken, as text (for `limiter.release`, in this or another process). */
  leaseToken?: string;
  /** Present when `leaseToken` is: gives the leases back; resolves to how many the store held. */
  release?: () => Promise<number>;
}

/** A sluice.toml that cannot be used: one `FILE:LINE: field: message` line per problem. */
export declare class ConfigError extends Error {
  readonly code: 'ConfigError';
}

/** A sluice.toml checked by the reader `sluice serve` uses. */
export declare class Config {
  private constructor();
  /** Reads and checks a file (relative Envoy files resolve next to it); throws `ConfigError`. */
  static load(path: string): Config;
  /** Checks configuration text; `file` names it in errors (default `<inline>`). */
  static parse(text: string, file?: string): Config;
  /** The file it was read from (null for `Config.parse`). */
  readonly path: string | null;
  /** Every `[policies.NAME]`, by name. */
  readonly policies: Record<string, Policy>;
  /** `store.url` with any password hidden. */
  readonly storeUrl: string;
}

/** What a settle did. */
export interface Settled {
  policy: string;
  /** The identity reserved for (a credential's hash). */
  identity: string;
  maxCost: number;
  /** The real cost it was settled with. */
  cost: number;
  /** `maxCost - cost`, given back. */
  refunded: number;
  /** `cost - maxCost`, charged beyond the reservation. */
  debt: number;
}

/** A maximum cost reserved by `limiter.reserve`; settle it with the real cost, once. */
export declare class Reservation {
  private constructor();
  readonly allowed: boolean;
  /** Settles it from any process sharing the store; null when nothing was reserved. */
  readonly id: string | null;
  readonly maxCost: number;
  /** The check of the maximum: numbers and headers as `limiter.check` answers them. */
  readonly checked: {
    allowed: boolean;
    remaining: number;
    limit: number;
    retryAfterMs: number;
    headers: Record<string, string>;
  };
  /** Rejects when settled already or when the store failed (it then counts in full). */
  settle(cost: number): Promise<Settled>;
}

export declare class Limiter {
  private constructor();
  /** The limiter a sluice.toml describes (store, hash key, headers, lists, plans, bans). */
  static fromConfig(config: Config | string): Promise<Limiter>;
  /** Connects to `"memory"` (default), `redis://`, `rediss://` or `redis+cluster://h:p,h:p`. */
  static connect(url?: string, options?: ConnectOptions): Promise<Limiter>;
  /** Never rejects for a store failure: the policy's failure mode decides (`verdict`). */
  check(policy: Policy, identity: string, options?: CheckOptions): Promise<Checked>;
  check(policy: Policy, options: CheckOptions & { credential: string | Buffer }): Promise<Checked>;
  release(policy: Policy, leaseToken: string): Promise<number>;
  /** Reserves `maxCost` until settled with the real cost, or `ttlMs` ends (then it counts in full). */
  reserve(
    policy: Policy,
    identity: string | null,
    maxCost: number,
    options?: { ttlMs?: number; credential?: string | Buffer },
  ): Promise<Reservation>;
  /** Settles a reservation by id, made by this or any process sharing the store. */
  settle(id: string, cost: number): Promise<Settled>;
  /** The identity a credential is limited as: `key:h<hex>`, as the Rust layer and `sluice serve` make it. */
  credentialIdentity(credential: string | Buffer): string;
  /** The store key of a policy and identity: `rl:{<identity>}:<policy>`. */
  key(policy: Policy, identity: string): string;
  /** `memory` or `redis`. */
  readonly store: string;
  readonly circuitOpen: boolean;
  readonly denyCacheHits: number;
}

/** One rule of the middleware: which policies apply under a path prefix. */
export interface RateLimitRule {
  /** Segment-wise: `/api` covers `/api` and `/api/x`, not `/apix`. Longest prefix wins. */
  prefix: string;
  /** Only these methods (default all); for equal prefixes a rule naming the method wins. */
  methods?: string[];
  /** No policies exempts the prefix. */
  policies?: Policy[];
  /** What one request costs (default 1). */
  cost?: number;
}

/**
 * Options of the Express middleware and the Fastify plugin: rules in code, or `config`, a
 * sluice.toml whose routes are limited as `sluice serve` limits them (then only `limiter`
 * may be given besides, and defaults to the file's own).
 */
export type RateLimitOptions = RuleOptions | ConfigOptions;

export interface ConfigOptions {
  /** A sluice.toml (a `Config` or its path). */
  config: Config | string;
  /** Default: `Limiter.fromConfig(config)`. */
  limiter?: Limiter | Promise<Limiter>;
}

export interface RuleOptions {
  limiter: Limiter | Promise<Limiter>;
  rules?: RateLimitRule[];
  /** Shorthand for a rule for `/`. */
  policies?: Policy[];
  /** A header carrying an API key (e.g. `x-api-key`), hashed before use. */
  apiKeyHeader?: string;
  /** Limit `Authorization: Bearer <token>` by its hashed token. */
  bearer?: boolean;
  /** Which peers may set `Forwarded` / `X-Forwarded-For` / `X-Real-IP`: networks, or a hop count. Default nobody. */
  trustedProxies?: string[] | number;
  /** IPv6 clients are grouped by this prefix (default 64). */
  ipv6Prefix?: number;
  /** IPv4 clients are grouped by this prefix (default 32). */
  ipv4Prefix?: number;
  /** 64 hex digits; default the limiter's. */
  hashKey?: string;
  /** `RateLimit-Policy` and `RateLimit` on responses (default true). */
  ratelimitHeaders?: boolean;
  /** `X-RateLimit-*` on responses (default false). */
  legacyHeaders?: boolean;
  /** Status when the store fails and a policy fails closed: 503 (default) or 429. */
  failClosedStatus?: number;
}
