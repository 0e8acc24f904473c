//! `sluice-http`: rate limiting for HTTP services, as a tower layer for axum and hyper.
//!
//! # Layout
//! - [`headers`]: the `RateLimit-Policy` / `RateLimit` fields, the legacy `X-RateLimit-*`
//!   headers, `Retry-After` and the 429 problem+json answer. Pure formatting, usable without
//!   the layer (the `sluice serve` HTTP API, the reverse proxy and the Envoy service share it),
//!   including which decision leads an answer and the problem+json error bodies.
//! - [`identity`]: who a request is limited as: hashed API keys and bearer tokens, identities
//!   supplied by the application, and the client IP behind trusted proxies only.
//! - [`path`]: the normal form of a request path (percent-decoding of unreserved characters,
//!   dot segments, repeated slashes) that rules match and the proxy forwards, and the
//!   ambiguous paths refused with 400.
//! - [`rule`]: [`Rule`], which policies apply to which paths and methods (the layer and the
//!   `sluice serve` proxy match requests with it alike).
//! - [`count`]: [`Count`], which responses a rule charges for (all, successes, failures or
//!   listed statuses), and the reserve-at-the-check then settle-on-the-status steps.
//! - [`decide`]: [`Decider`], the answer to one request from its method, target, headers and
//!   peer (path normalization, rule, identity, control plane, policies, count-by-outcome
//!   settling, the headers and problem+json bodies). The layer, the `sluice serve` proxy and
//!   the Python and Node middleware all answer through it.
//! - [`layer`]: [`RateLimitLayer`] and its service: the decider as tower middleware.
//! - [`body`]: [`LeaseGuard`] and [`RateLimitBody`], which hold concurrency leases until the
//!   response ends.
//! - [`stats`]: [`RateLimitStats`], the counts of what was decided.
//! - [`settle`]: [`settle::ReserveLayer`], a route's reservation of a request's maximum cost,
//!   settled from the `usage` its response reports (JSON or event stream).
//!
//! See `docs/http.md` for adding it to an axum app, every header it sends and why, and how
//! to configure trusted proxies.
#![forbid(unsafe_code)]

pub mod body;
// Reservations settled from the response's usage (`[routes.reserve]`).
pub mod count;
pub mod decide;
pub mod headers;
pub mod identity;
pub mod layer;
pub mod path;
pub mod rule;
pub mod settle;
pub mod stats;

pub use count::{Count, UpstreamFailed};
pub use decide::{Admission, Answer, Decider, Finished, Outcome, Refusal, RequestHead};
pub use headers::{HeaderOptions, rate_limit_headers, too_many_requests};
pub use identity::{ClientIpConfig, IdentityResolver, IdentitySource, TrustedProxies};
pub use layer::{
    LeaseGuard, RateLimit, RateLimitBody, RateLimitIdentity, RateLimitLayer, RateLimitLayerBuilder,
    RateLimitStats, StatsSnapshot,
};
pub use rule::Rule;
