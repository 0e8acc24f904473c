//! Which token admits which endpoint: the one rule, on the configuration that holds the
//! tokens, for the auth boundary of `sluice serve` ([`Access`] per endpoint, its tokens from
//! [`Config::accepted_tokens`]), the `/v1/stats` report (served beyond loopback only when a
//! token guards it), and the start-up checks and warnings about exposed control endpoints.
//!
//! - [`Access::Open`]: health, the OpenAPI document, the console's page and assets. No token.
//! - [`Access::Decision`]: what applications call (`/v1/check`, `/v1/release`, reading
//!   `/v1/state`). `server.api_token` when one is set; `admin_token` is accepted too, so the
//!   console (which holds the admin token) can read state.
//! - [`Access::Control`]: every endpoint that changes state outside a check, and `/v1/stats`
//!   (it names identities). `admin_token`, else `server.api_token` when only that is set.
//! - [`Access::Metrics`]: `/metrics`. `admin_token` when set (a scraper holds no API token).

use crate::Config;

/// Who may call an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No data and no effect: served to anyone.
    Open,
    /// The decision API: what applications call.
    Decision,
    /// Changes to limits and the control plane, and the report that names identities.
    Control,
    /// The Prometheus text.
    Metrics,
}

/// The endpoints of [`Access::Control`], as messages name them.
pub const CONTROL_ENDPOINTS: &str = "/v1/overrides, /v1/bans, /v1/lists/*, DELETE /v1/state, \
                                     /v1/charge, /v1/refund, /admin/*";

impl Config {
    /// The tokens that admit a request of `access`, and the setting a refusal names (`""`
    /// when no token is needed). No tokens means the endpoint is open (on a loopback
    /// listener, or by `server.public_admin_without_token`).
    pub fn accepted_tokens(&self, access: Access) -> (Vec<&str>, &'static str) {
        let api = self.server.api_token.as_deref();
        let admin = self.admin_token.as_deref();
        match access {
            Access::Open => (Vec::new(), ""),
            Access::Decision => match api {
                Some(api) => (std::iter::once(api).chain(admin).collect(), "api_token"),
                None => (Vec::new(), ""),
            },
            Access::Control => match (admin, api) {
                (Some(admin), _) => (vec![admin], "admin_token"),
                (None, Some(api)) => (vec![api], "api_token"),
                (None, None) => (Vec::new(), ""),
            },
            Access::Metrics => (admin.into_iter().collect(), "admin_token"),
        }
    }

    /// True when some token guards requests of `access`.
    pub fn guarded(&self, access: Access) -> bool {
        !self.accepted_tokens(access).0.is_empty()
    }
}
