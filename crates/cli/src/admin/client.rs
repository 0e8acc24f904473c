//! The one HTTP exchange of `sluice admin` (and of `sluice top`, which reads `/v1/stats`
//! through it): a [`Call`] sent to the `sluice serve` HTTP listener with the bearer token,
//! bounded by a timeout, answered with the status and the body as they came.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::{BodyExt, Full};
use serde_json::{Map, Value};

/// One HTTP call: method, path (with query) and an optional JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The method.
    pub method: Method,
    /// Path and query.
    pub path: String,
    /// The JSON body.
    pub body: Option<Value>,
}

pub(super) fn call(method: Method, path: &str, body: Map<String, Value>) -> Call {
    Call {
        method,
        path: path.to_string(),
        body: Some(Value::Object(body)),
    }
}

/// Sends `c` to `base`; the status and the body.
pub(crate) async fn send(
    base: &str,
    token: Option<&str>,
    c: &Call,
    timeout: Duration,
) -> Result<(u16, Bytes), String> {
    let base = base.trim_end_matches('/');
    if !base.starts_with("http://") {
        return Err(format!(
            "--url {base:?}: expected http://HOST:PORT (the sluice serve HTTP listener)"
        ));
    }
    let uri = format!("{base}{}", c.path);
    let mut req = Request::builder().method(c.method.clone()).uri(&uri);
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let body = match &c.body {
        Some(v) => {
            req = req.header(header::CONTENT_TYPE, "application/json");
            Bytes::from(v.to_string())
        }
        None => Bytes::new(),
    };
    let req = req
        .body(Full::new(body))
        .map_err(|e| format!("invalid request to {uri}: {e}"))?;
    let client: hyper_util::client::legacy::Client<_, Full<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let exchange = async {
        let res = client
            .request(req)
            .await
            .map_err(|e| format!("cannot reach {uri}: {e}"))?;
        let status = res.status().as_u16();
        let body = res
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("reading the answer of {uri}: {e}"))?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("no answer from {uri} within {} s", timeout.as_secs()))?
}
