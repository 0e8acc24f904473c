//! Identity sources: where the reverse proxy finds the identity a policy limits, parsed once
//! from `identity = "..."` and turned once into the `sluice-http` layer's source.

use sluice_http::IdentitySource as LayerSource;

/// Where a policy's identity comes from when the reverse proxy enforces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentitySource {
    /// The client address (after trusted proxies).
    Ip,
    /// A request header, as is (an id set by an authenticating gateway); a value that is not
    /// plain text or is over 512 bytes is hashed (`sluice_http::identity::header_identity`).
    Header(http::HeaderName),
    /// A credential header (API key); hashed with the identity hash key before use.
    ApiKey(http::HeaderName),
    /// The bearer token of `Authorization`, hashed.
    Bearer,
    /// One shared limit for everyone.
    Global,
}

impl std::str::FromStr for IdentitySource {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let header = |h: &str| {
            http::HeaderName::from_bytes(h.trim().as_bytes())
                .map_err(|_| format!("invalid header name {h:?}"))
        };
        match s.split_once(':') {
            None if s == "ip" => Ok(IdentitySource::Ip),
            None if s == "bearer" => Ok(IdentitySource::Bearer),
            None if s == "global" => Ok(IdentitySource::Global),
            Some(("header", h)) => Ok(IdentitySource::Header(header(h)?)),
            Some(("api-key", h)) => Ok(IdentitySource::ApiKey(header(h)?)),
            _ => Err(format!(
                "unknown identity source {s:?}: expected ip, header:NAME, api-key:NAME, bearer or global"
            )),
        }
    }
}

impl IdentitySource {
    /// The `sluice-http` layer's source for this identity; `None` for the client IP, which
    /// the layer falls back to by itself.
    pub fn layer_source(&self) -> Option<LayerSource> {
        match self {
            IdentitySource::Ip => None,
            IdentitySource::ApiKey(h) => Some(LayerSource::ApiKey(h.clone())),
            IdentitySource::Bearer => Some(LayerSource::Bearer),
            IdentitySource::Header(h) => Some(LayerSource::Header(h.clone())),
            IdentitySource::Global => Some(LayerSource::custom(|_| {
                Some(sluice::Identity::new("global"))
            })),
        }
    }
}
