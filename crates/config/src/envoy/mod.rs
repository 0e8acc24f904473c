//! Envoy rate limit domains: the envoyproxy/ratelimit YAML files, descriptor matching, and the
//! plan of limiter checks for one `ShouldRateLimit` request.
//!
//! The three steps change for different reasons, so each has its own module:
//! - [`file`]: the YAML format as the reference service reads it (plus the sluice
//!   `rate_limit.algorithm` extension), checked while it is read.
//! - [`tree`]: the domains compiled into lookup trees; matching follows the reference service.
//! - [`plan`]: one request's descriptors turned into the checks to run.
//!
//! Everything here is pure: no sockets, no store. `sluice_server::rls` runs the plan.

pub mod file;
pub mod plan;
pub mod tree;

pub use file::{DescriptorFile, DescriptorList, DomainFile, RateLimitFile, Unit, quota_algorithms};
pub use plan::{LimitCheck, Plan, RequestDescriptor, envoy_identity, plan};
pub use tree::{Domains, Limit, build_policy, policy_name};
