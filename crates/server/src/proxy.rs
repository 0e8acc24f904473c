//! The reverse proxy: sluice in front of an upstream (a FastAPI or Express app, anything
//! speaking HTTP/1.1), enforcing the policies of each route.
//!
//! Enforcement is the `sluice-http` tower layer, the same code an axum app links, deciding
//! through the same [`sluice_http::Decider`] as the Python and Node middleware, and built
//! from the route by [`sluice_config::route_layers`] as they build theirs, so a route
//! behaves exactly like the layer: identities (hashed API keys, bearer tokens, client IP behind
//! trusted proxies only), 429 with problem+json and `Retry-After`, fail-closed 503, shaping
//! delays, concurrency leases held until the response body ends, RateLimit headers on admitted
//! responses. Policies of one route that take their identity from different sources are
//! separate layers, one inside the other (one all-or-nothing check per identity); each layer
//! adds its policies to the `RateLimit` and `RateLimit-Policy` lists, so the response
//! describes every policy of the route. Routes are matched with the layer's own [`Rule`].
//! A route's `count` becomes each of its layers' [`sluice_http::Count`]: with anything but
//! `"all"` a layer reserves the cost at the check and refunds it once the upstream's status
//! turns out not to be counted.
//!
//! Paths are normalized before anything else ([`sluice_http::path`]): routes match the normal
//! form (case-insensitively for a route with `case_insensitive = true`), a path with no safe
//! normal form is answered `400`, and the upstream receives exactly the normalized path that
//! was limited (the query string as sent). A route that counts by outcome reserves its cost at
//! the check; the 502 and 504 the proxy answers for a failed upstream carry
//! [`sluice_http::UpstreamFailed`], so such a request stays counted whatever the route counts.
//!
//! Forwarding streams both bodies (nothing is buffered), drops hop-by-hop headers, and appends
//! the client's address to `X-Forwarded-For` so the upstream sees who called. Connecting to an
//! upstream is bounded by `proxy.connect_timeout` (502 past it) and waiting for its response
//! head by `proxy.upstream_timeout` (504), so a stuck upstream never holds a request forever.
//! The route table is rebuilt when the configuration generation changes.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::response::Response;
use http::header::{CONNECTION, HOST};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;
use sluice_http::{Rule, UpstreamFailed};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};

use crate::api::problem;
use crate::state::{Runtime, Shared};

type RouteService = BoxCloneSyncService<Request, Response, Infallible>;
type HttpClient = Client<HttpConnector, Body>;

#[derive(Debug)]
struct Table {
    generation: u64,
    /// The upstream client, built with this connect timeout; kept across reloads that leave
    /// the timeout alone, so pooled upstream connections survive them.
    client: HttpClient,
    connect_timeout: Duration,
    /// Each route's rule (prefix, methods, all its policies) and service, in the order
    /// [`Rule::precedence`] tries them: the same matching as the tower layer's.
    routes: Vec<(Rule, RouteService)>,
}

#[derive(Debug, Clone)]
struct ProxyState {
    shared: Shared,
    table: Arc<Mutex<Option<Arc<Table>>>>,
}

impl ProxyState {
    fn table(&self, rt: &Runtime) -> Arc<Table> {
        let mut cached = self.table.lock();
        if let Some(t) = cached.as_ref().filter(|t| t.generation == rt.generation) {
            return Arc::clone(t);
        }
        let connect_timeout = rt.config.proxy.connect_timeout;
        let client = match cached.as_ref() {
            Some(t) if t.connect_timeout == connect_timeout => t.client.clone(),
            _ => http_client(connect_timeout),
        };
        let t = Arc::new(build_table(rt, client));
        *cached = Some(Arc::clone(&t));
        t
    }
}

/// The client that forwards to upstreams: no Nagle delay, connects bounded by `connect_timeout`.
fn http_client(connect_timeout: Duration) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(connect_timeout));
    Client::builder(TokioExecutor::new()).build(connector)
}

fn build_table(rt: &Runtime, client: HttpClient) -> Table {
    let config = &rt.config;
    let mut routes = Vec::with_capacity(config.routes.len());
    for route in &config.routes {
        let upstream = route.upstream.clone();
        let client = client.clone();
        let timeout = config.proxy.upstream_timeout;
        let mut service: RouteService =
            BoxCloneSyncService::new(tower::service_fn(move |req: Request| {
                let client = client.clone();
                let upstream = upstream.clone();
                async move { Ok::<_, Infallible>(forward(&client, &upstream, timeout, req).await) }
            }));
        // A reservation (`[routes.reserve]`) is innermost: only a request every policy of the
        // route admitted reserves its maximum.
        if let Some(spec) = &route.reserve
            && let Some(pc) = config.policies.get(&spec.policy)
        {
            let identities = sluice_http::IdentityResolver::new(
                pc.layer_identity.clone().into_iter().collect(),
                config.identity_hash_key,
                sluice_http::ClientIpConfig {
                    trusted: config.proxy.trusted_proxies.clone(),
                    ..Default::default()
                },
            );
            let policy = Arc::clone(&pc.policy);
            let limiter = rt.limiter.clone();
            let layer = sluice_http::settle::ReserveLayer::new(
                limiter,
                policy,
                spec.clone(),
                identities,
                config.headers,
            );
            service = BoxCloneSyncService::new(layer.layer(service));
        }
        // The first layer listed is the outermost, so it is applied last.
        for layer in sluice_config::route_layers(config, route, &rt.limiter)
            .into_iter()
            .rev()
        {
            let layered = layer.layer(service);
            service = BoxCloneSyncService::new(
                layered.map_response(|res: http::Response<_>| res.map(Body::new)),
            );
        }
        routes.push((sluice_config::route_rule(config, route), service));
    }
    routes.sort_by(|a, b| a.0.precedence(&b.0));
    Table {
        generation: rt.generation,
        client,
        connect_timeout: config.proxy.connect_timeout,
        routes,
    }
}

/// Headers that describe one connection, not the message; never forwarded.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authenticate",
];

fn strip_hop_by_hop(h: &mut HeaderMap) {
    let listed: Vec<HeaderName> = h
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in listed {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(n);
    }
}

fn upstream_uri(upstream: &Uri, original: &Uri) -> Option<Uri> {
    let base = upstream.path().trim_end_matches('/');
    let pq = original.path_and_query().map_or("/", |p| p.as_str());
    let mut parts = upstream.clone().into_parts();
    parts.path_and_query = Some(format!("{base}{pq}").parse().ok()?);
    Uri::from_parts(parts).ok()
}

async fn forward(
    client: &HttpClient,
    upstream: &Uri,
    timeout: Option<Duration>,
    req: Request,
) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let (mut parts, body) = req.into_parts();
    let Some(uri) = upstream_uri(upstream, &parts.uri) else {
        return problem(
            StatusCode::BAD_REQUEST,
            "the request path cannot be forwarded",
        );
    };
    strip_hop_by_hop(&mut parts.headers);
    if let Some(peer) = peer {
        let ip = peer.ip().to_canonical().to_string();
        let value = match parts
            .headers
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok())
        {
            Some(prev) if !prev.trim().is_empty() => format!("{prev}, {ip}"),
            _ => ip,
        };
        // Several X-Forwarded-For lines are one list; write it back as one.
        parts.headers.remove("x-forwarded-for");
        if let Ok(v) = HeaderValue::from_str(&value) {
            parts.headers.insert("x-forwarded-for", v);
        }
    }
    if let Some(host) = parts.headers.get(HOST).cloned() {
        parts.headers.insert("x-forwarded-host", host);
    }
    parts
        .headers
        .insert("x-forwarded-proto", HeaderValue::from_static("http"));
    parts.uri = uri;
    parts.version = http::Version::HTTP_11;
    let out = http::Request::from_parts(parts, body);
    let sent = client.request(out);
    let result = match timeout {
        Some(t) => match tokio::time::timeout(t, sent).await {
            Ok(r) => r,
            Err(_) => {
                return upstream_failed(problem(
                    StatusCode::GATEWAY_TIMEOUT,
                    &format!("the upstream did not answer within {t:?}"),
                ));
            }
        },
        None => sent.await,
    };
    match result {
        Ok(res) => {
            let (mut parts, body) = res.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, Body::new(body))
        }
        Err(e) => {
            tracing::warn!(error = %e, upstream = %upstream, "upstream request failed");
            upstream_failed(problem(
                StatusCode::BAD_GATEWAY,
                "the upstream could not be reached",
            ))
        }
    }
}

/// Marks a stand-in answer for a failed upstream, so a route counting by outcome keeps the
/// request counted (the upstream may have acted on it).
fn upstream_failed(mut res: Response) -> Response {
    res.extensions_mut().insert(UpstreamFailed);
    res
}

async fn dispatch(State(state): State<ProxyState>, mut req: Request) -> Response {
    match sluice_http::path::normalize_uri(req.uri()) {
        Ok(None) => {}
        Ok(Some(normal)) => *req.uri_mut() = normal,
        Err(e) => {
            metrics::counter!("sluice_proxy_requests_total", "route" => "none", "status" => "400")
                .increment(1);
            return problem(StatusCode::BAD_REQUEST, e.message());
        }
    }
    let rt = state.shared.runtime();
    let table = state.table(&rt);
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let found = table.routes.iter().find(|(r, _)| r.matches(&method, &path));
    let Some((rule, service)) = found else {
        metrics::counter!("sluice_proxy_requests_total", "route" => "none", "status" => "404")
            .increment(1);
        return problem(
            StatusCode::NOT_FOUND,
            &format!("no route for {method} {path}"),
        );
    };
    let prefix = rule.prefix().to_string();
    // One span per proxied request when `[telemetry]` is on; the upstream gets it as parent.
    let span = (state.shared.telemetry()).start_http(crate::telemetry::Entry::Proxy, req.headers());
    span.propagate(req.headers_mut());
    let status =
        |r: &Result<Response, Infallible>| r.as_ref().ok().map(|r| i64::from(r.status().as_u16()));
    let res = match span.run(service.clone().oneshot(req), status).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let class = match res.status().as_u16() {
        429 => "429",
        s if s < 300 => "2xx",
        s if s < 400 => "3xx",
        s if s < 500 => "4xx",
        _ => "5xx",
    };
    metrics::counter!("sluice_proxy_requests_total", "route" => prefix, "status" => class)
        .increment(1);
    res
}

/// The proxy as a router: every request goes through route matching, the route's policies and
/// then the upstream.
pub fn router(shared: Shared) -> axum::Router {
    let state = ProxyState {
        shared,
        table: Arc::new(Mutex::new(None)),
    };
    axum::Router::new().fallback(dispatch).with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_paths_keep_the_base() {
        let up: Uri = "http://127.0.0.1:9/base/".parse().unwrap();
        let u = upstream_uri(&up, &"/api/x?y=1".parse().unwrap()).unwrap();
        assert_eq!(u.to_string(), "http://127.0.0.1:9/base/api/x?y=1");
        let up: Uri = "http://127.0.0.1:9".parse().unwrap();
        assert_eq!(
            upstream_uri(&up, &"/".parse().unwrap())
                .unwrap()
                .to_string(),
            "http://127.0.0.1:9/"
        );
    }

    #[test]
    fn hop_by_hop_headers_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("close, x-private"));
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }
}
