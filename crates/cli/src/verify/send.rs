//! The sending side of `sluice verify`: the targets (decision API, proxy route, Envoy rate
//! limit service) and one request to each, read back as admitted, limited or failed. All the
//! I/O of a run is here; what the answers mean is judged in `judge.rs`.

use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use http_body_util::{BodyExt, Full};
use sluice_core::{Clock, SystemClock};

use super::judge::Answer;

/// Where a request goes.
#[derive(Debug, Clone)]
pub(super) enum Target {
    Api { uri: http::Uri, policy: String },
    Proxy { uri: http::Uri },
    Rls { endpoint: String },
}

impl Target {
    pub(super) fn describe(&self) -> String {
        match self {
            Target::Api { uri, .. } => format!("api {uri}"),
            Target::Proxy { uri } => format!("proxy {uri}"),
            Target::Rls { endpoint } => format!("rls {endpoint}"),
        }
    }
}

pub(super) fn http_uri(url: &str, default_path: Option<&str>) -> Result<http::Uri, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("bad URL {url:?}: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!("{url:?}: only http:// URLs are supported"));
    }
    match default_path {
        Some(path) if uri.path() == "/" => format!("{}{path}", url.trim_end_matches('/'))
            .parse::<http::Uri>()
            .map_err(|e| format!("bad URL {url:?}: {e}")),
        _ => Ok(uri),
    }
}

/// A value for `{run}`: different for every run, so each run starts on a fresh key.
pub(super) fn run_id() -> String {
    format!("{:x}{:x}", SystemClock.now(), std::process::id())
}

pub(super) fn parse_header(
    h: &str,
    run: &str,
) -> Result<(http::HeaderName, http::HeaderValue), String> {
    let (n, v) = h
        .split_once(':')
        .ok_or_else(|| format!("header {h:?} must look like 'name: value'"))?;
    let name = http::HeaderName::from_bytes(n.trim().as_bytes())
        .map_err(|e| format!("header name {n:?}: {e}"))?;
    let value = http::HeaderValue::from_str(&v.trim().replace("{run}", run))
        .map_err(|e| format!("header value {v:?}: {e}"))?;
    Ok((name, value))
}

pub(super) type HttpClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

/// What every request of the run shares.
pub(super) struct Sender {
    pub(super) http: HttpClient,
    pub(super) rls: Vec<Option<RateLimitServiceClient<tonic::transport::Channel>>>,
    pub(super) targets: Vec<Target>,
    pub(super) api_body: Bytes,
    pub(super) token: Option<String>,
    pub(super) headers: Vec<(http::HeaderName, http::HeaderValue)>,
    pub(super) rls_request: RateLimitRequest,
    pub(super) timeout: Duration,
}

impl Sender {
    pub(super) async fn send(&self, target: usize) -> Answer {
        let answer = tokio::time::timeout(self.timeout, self.send_untimed(target)).await;
        answer.unwrap_or(Answer::Failed)
    }

    async fn send_untimed(&self, target: usize) -> Answer {
        match &self.targets[target] {
            Target::Api { uri, .. } => {
                let mut req = http::Request::post(uri.clone())
                    .header(http::header::CONTENT_TYPE, "application/json");
                if let Some(t) = &self.token {
                    req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
                }
                let Ok(req) = req.body(Full::new(self.api_body.clone())) else {
                    return Answer::Failed;
                };
                let Ok(resp) = self.http.request(req).await else {
                    return Answer::Failed;
                };
                if resp.status() != http::StatusCode::OK {
                    return Answer::Failed;
                }
                let Ok(body) = resp.into_body().collect().await else {
                    return Answer::Failed;
                };
                let v: serde_json::Value =
                    serde_json::from_slice(&body.to_bytes()).unwrap_or_default();
                match v.get("allowed").and_then(serde_json::Value::as_bool) {
                    Some(true) => Answer::Admitted,
                    Some(false) => Answer::Limited,
                    None => Answer::Failed,
                }
            }
            Target::Proxy { uri } => {
                let mut req = http::Request::get(uri.clone());
                for (k, v) in &self.headers {
                    req = req.header(k, v);
                }
                let Ok(req) = req.body(Full::new(Bytes::new())) else {
                    return Answer::Failed;
                };
                let Ok(resp) = self.http.request(req).await else {
                    return Answer::Failed;
                };
                let status = resp.status();
                let _ = resp.into_body().collect().await;
                if status.is_success() {
                    Answer::Admitted
                } else if status == http::StatusCode::TOO_MANY_REQUESTS {
                    Answer::Limited
                } else {
                    Answer::Failed
                }
            }
            Target::Rls { .. } => {
                let Some(Some(client)) = self.rls.get(target) else {
                    return Answer::Failed;
                };
                match client
                    .clone()
                    .should_rate_limit(self.rls_request.clone())
                    .await
                {
                    Ok(r) if r.get_ref().overall_code == Code::Ok as i32 => Answer::Admitted,
                    Ok(r) if r.get_ref().overall_code == Code::OverLimit as i32 => Answer::Limited,
                    _ => Answer::Failed,
                }
            }
        }
    }
}
