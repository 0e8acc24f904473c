//! The rate limiting a `[[routes]]` entry asks for, as `sluice-http` layers and deciders.
//!
//! `sluice serve`'s reverse proxy, the tower-layer example app (`sluice-example-layer-app`)
//! and the Python and Node packages all build a route's limiting here, so the same file
//! limits a path identically whichever of them serves it: the route's [`Rule`] (prefix,
//! methods, case) and one layer per identity source among its policies (a layer checks all
//! its policies at once for one identity; layers nest, the first listed outermost), each
//! with the route's `count`, the file's hash key, trusted proxies and header options.

use std::sync::Arc;

use sluice::{Limiter, Policy};
use sluice_http::decide::Decider;
use sluice_http::{ClientIpConfig, RateLimitLayer, RateLimitLayerBuilder, Rule};

use crate::{Config, PolicyConfig, Route};

/// The rule a route is matched by (prefix, methods, case), with all of its policies listed,
/// for ordering routes ([`Rule::precedence`]) and matching requests ([`Rule::matches`]).
pub fn route_rule(config: &Config, route: &Route) -> Rule {
    let mut rule = Rule::new(route.prefix.clone())
        .methods(route.methods.iter().cloned())
        .case_insensitive(route.case_insensitive);
    for name in &route.policies {
        if let Some(pc) = config.policies.get(name) {
            rule = rule.policy(Arc::clone(&pc.policy));
        }
    }
    rule
}

/// One builder per identity source among the route's policies, in the order the policies
/// are listed (the first is the outermost layer). Each covers every path it is applied to
/// (rule `/`): the route has been matched before it runs.
fn route_builders(config: &Config, route: &Route, limiter: &Limiter) -> Vec<RateLimitLayerBuilder> {
    let client_ip = ClientIpConfig {
        trusted: config.proxy.trusted_proxies.clone(),
        ..ClientIpConfig::default()
    };
    let mut groups: Vec<(&PolicyConfig, Vec<Arc<Policy>>)> = Vec::new();
    for name in &route.policies {
        let Some(pc) = config.policies.get(name) else {
            continue;
        };
        match groups.iter_mut().find(|g| g.0.identity == pc.identity) {
            Some(g) => g.1.push(Arc::clone(&pc.policy)),
            None => groups.push((pc, vec![Arc::clone(&pc.policy)])),
        }
    }
    groups
        .into_iter()
        .map(|(first, policies)| {
            let mut rule = Rule::new("/").count(route.count.clone());
            for p in policies {
                rule = rule.policy(p);
            }
            let mut b = RateLimitLayer::builder(limiter.clone())
                .rule(rule)
                .hash_key(config.identity_hash_key)
                .client_ip(client_ip.clone())
                .headers(config.headers);
            if let Some(s) = first.layer_identity.clone() {
                b = b.identity(s);
            }
            b
        })
        .collect()
}

/// The layers that enforce `route`'s policies, outermost first: apply them in reverse order
/// (`for l in layers.into_iter().rev() { service = l.layer(service) }`).
pub fn route_layers(config: &Config, route: &Route, limiter: &Limiter) -> Vec<RateLimitLayer> {
    route_builders(config, route, limiter)
        .into_iter()
        .map(RateLimitLayerBuilder::build)
        .collect()
}

/// The deciders of [`route_layers`], outermost first, for a front end that is not a tower
/// service: decide with each in turn (stop at the first refusal), then finish every admission
/// with the response status, innermost first, merging each one's headers into the response.
pub fn route_deciders(config: &Config, route: &Route, limiter: &Limiter) -> Vec<Arc<Decider>> {
    route_builders(config, route, limiter)
        .into_iter()
        .map(RateLimitLayerBuilder::build_decider)
        .collect()
}
