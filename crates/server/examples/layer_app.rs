//! `layer_app`: a small axum application behind the `sluice-http` tower layer, limited by the
//! `[[routes]]` of a `sluice.toml` exactly as `sluice serve`'s reverse proxy limits them (the
//! same [`sluice::config::route_layers`] and [`sluice::config::route_rule`], the same store,
//! lists, plans and bans through the configuration's limiter). It is the tower-layer side of
//! the tests that send the same requests to every front end (the layer, the proxy, the Python
//! and the Node middleware) and expect the same answers.
//!
//! ```text
//! cargo run -p sluice-server --example layer_app -- path/to/sluice.toml 8099
//! ```
//!
//! It prints `listening on 127.0.0.1:PORT` once it accepts connections (port 0 picks a free
//! one). Each route's `upstream` is ignored: the application answers itself, with the same
//! endpoints as the FastAPI and Express test upstreams (`sluice_testkit::upstream`):
//! - `GET|POST /login?password=...`: 200 for `right`, 401 otherwise;
//! - `GET|POST /slow?ms=N`: 200 after `N` ms (default 300);
//! - `GET /__hits`: what reached the handlers, as JSON (not counted);
//! - anything else: 200 with `{"path": ...}`, the path the handler received.
//!
//! Requests are matched to routes by their normalized path (a path with no safe normal form
//! is answered 400, as by the proxy); a request no route matches reaches the application
//! unlimited, as with the Python and Node middleware.
#![forbid(unsafe_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use http::StatusCode;
use serde_json::{Value, json};
use sluice_http::Rule;
use sluice_server::Config;
use sluice_server::config::{route_layers, route_rule};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};

type AppService = BoxCloneSyncService<Request, Response, Infallible>;

/// What reached the application's handlers.
#[derive(Debug, Default)]
struct Hits {
    login: u64,
    slow: u64,
    slow_done: u64,
    other: u64,
    targets: Vec<String>,
}

type SharedHits = Arc<Mutex<Hits>>;

/// The application itself, unlimited.
fn application(hits: SharedHits) -> axum::Router {
    async fn login(
        State(hits): State<SharedHits>,
        Query(q): Query<Vec<(String, String)>>,
    ) -> Response {
        hits.lock().unwrap().login += 1;
        if q.iter().any(|(k, v)| k == "password" && v == "right") {
            axum::Json(json!({"ok": true})).into_response()
        } else {
            (StatusCode::UNAUTHORIZED, axum::Json(json!({"ok": false}))).into_response()
        }
    }
    async fn slow(
        State(hits): State<SharedHits>,
        Query(q): Query<Vec<(String, String)>>,
    ) -> Response {
        let ms = q
            .iter()
            .find(|(k, _)| k == "ms")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(300);
        hits.lock().unwrap().slow += 1;
        tokio::time::sleep(Duration::from_millis(ms)).await;
        hits.lock().unwrap().slow_done += 1;
        axum::Json(json!({"ok": true})).into_response()
    }
    async fn other(State(hits): State<SharedHits>, req: Request) -> Response {
        hits.lock().unwrap().other += 1;
        axum::Json(json!({"path": req.uri().path()})).into_response()
    }
    async fn get_hits(State(hits): State<SharedHits>) -> axum::Json<Value> {
        let h = hits.lock().unwrap();
        axum::Json(json!({
            "login": h.login, "slow": h.slow, "slow_done": h.slow_done, "other": h.other,
            "targets": h.targets,
        }))
    }
    let record = axum::middleware::from_fn_with_state(
        Arc::clone(&hits),
        |State(hits): State<SharedHits>, req: Request, next: axum::middleware::Next| async move {
            if req.uri().path() != "/__hits" {
                let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
                hits.lock().unwrap().targets.push(target.to_string());
            }
            next.run(req).await
        },
    );
    axum::Router::new()
        .route("/login", any(login))
        .route("/slow", any(slow))
        .route("/__hits", axum::routing::get(get_hits))
        .fallback(other)
        .layer(record)
        .with_state(hits)
}

/// Each route's rule and the application behind that route's layers, in the order
/// [`Rule::precedence`] tries them, then the application for requests no route matches.
struct Routes {
    routes: Vec<(Rule, AppService)>,
    unlimited: AppService,
}

fn routes(config: &Config, limiter: &sluice::Limiter, app: axum::Router) -> Routes {
    let app = BoxCloneSyncService::new(app.into_service::<Body>());
    let mut routes = Vec::with_capacity(config.routes.len());
    for route in &config.routes {
        let mut service: AppService = app.clone();
        // The first layer listed is the outermost, so it is applied last.
        for layer in route_layers(config, route, limiter).into_iter().rev() {
            service = BoxCloneSyncService::new(
                layer
                    .layer(service)
                    .map_response(|res: http::Response<_>| res.map(Body::new)),
            );
        }
        routes.push((route_rule(config, route), service));
    }
    routes.sort_by(|a, b| a.0.precedence(&b.0));
    Routes {
        routes,
        unlimited: app,
    }
}

async fn dispatch(State(routes): State<Arc<Routes>>, mut req: Request) -> Response {
    match sluice_http::path::normalize_uri(req.uri()) {
        Ok(None) => {}
        Ok(Some(normal)) => *req.uri_mut() = normal,
        Err(e) => {
            return sluice_http::headers::problem(StatusCode::BAD_REQUEST, e.message())
                .map(Body::from);
        }
    }
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let service = routes
        .routes
        .iter()
        .find(|(rule, _)| rule.matches(&method, &path))
        .map_or(&routes.unlimited, |(_, s)| s);
    match service.clone().oneshot(req).await {
        Ok(res) => res,
        Err(never) => match never {},
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("layer_app: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(port)) = (args.next(), args.next()) else {
        return Err("usage: layer_app <sluice.toml> <port>".into());
    };
    let port: u16 = port.parse().map_err(|_| format!("invalid port {port:?}"))?;
    let config = Config::load(std::path::Path::new(&path))?;
    let limiter = sluice_server::state::build_limiter(&config).await?;
    // The file's lists, plans and ban rules, as `sluice serve` installs them.
    limiter.control().configure(config.control.clone());
    let app = application(Arc::default());
    let router = axum::Router::new()
        .fallback(dispatch)
        .with_state(Arc::new(routes(&config, &limiter, app)));
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
