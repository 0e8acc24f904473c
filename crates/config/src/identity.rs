//! Identity sources: where the reverse proxy finds the identity a policy limits, parsed once
//! from `identity = "..."` (or a list of them, a composite) and turned once into the
//! `sluice-http` layer's source. `[jwt]` holds the one key that `jwt:CLAIM` sources verify
//! tokens with; it is read and checked here, at load time, so a missing key file or a short
//! secret is a configuration error, never a silent fall-back at request time.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use sluice_http::IdentitySource as LayerSource;
use sluice_http::identity::{JwtAlgorithm, JwtVerifier};
use toml::Spanned;

use super::error::Checker;
use super::raw::{RawConfig, RawDuration};

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
    /// A cookie's value, always hashed (session cookies are credentials).
    Cookie(String),
    /// A query parameter's value, treated like a header.
    Query(String),
    /// A claim of a bearer JWT verified with the `[jwt]` key.
    Jwt(String),
    /// Several sources joined in order; a missing part makes the whole request fall back to
    /// the client IP.
    Composite(Vec<IdentitySource>),
}

/// `identity = "..."` or `identity = ["...", "..."]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum RawIdentity {
    One(String),
    All(Vec<String>),
}

/// `[jwt]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJwt {
    pub algorithm: Spanned<String>,
    pub secret: Option<Spanned<String>>,
    pub public_key: Option<Spanned<String>>,
    pub leeway: Option<Spanned<RawDuration>>,
    pub audience: Option<String>,
    pub issuer: Option<String>,
}

/// Characters allowed in a cookie, query parameter or claim name.
fn name_ok(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 128
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

impl std::str::FromStr for IdentitySource {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let header = |h: &str| {
            http::HeaderName::from_bytes(h.trim().as_bytes())
                .map_err(|_| format!("invalid header name {h:?}"))
        };
        let name = |kind: &str, n: &str| {
            let n = n.trim();
            if name_ok(n) {
                Ok(n.to_string())
            } else {
                Err(format!(
                    "invalid {kind} name {n:?}: use letters, digits, '_', '-' and '.' (at most 128)"
                ))
            }
        };
        match s.split_once(':') {
            None if s == "ip" => Ok(IdentitySource::Ip),
            None if s == "bearer" => Ok(IdentitySource::Bearer),
            None if s == "global" => Ok(IdentitySource::Global),
            Some(("header", h)) => Ok(IdentitySource::Header(header(h)?)),
            Some(("api-key", h)) => Ok(IdentitySource::ApiKey(header(h)?)),
            Some(("cookie", c)) => Ok(IdentitySource::Cookie(name("cookie", c)?)),
            Some(("query", q)) => Ok(IdentitySource::Query(name("query parameter", q)?)),
            Some(("jwt", c)) => Ok(IdentitySource::Jwt(name("claim", c)?)),
            _ => Err(format!(
                "unknown identity source {s:?}: expected ip, header:NAME, api-key:NAME, bearer, \
                 cookie:NAME, query:NAME, jwt:CLAIM or global"
            )),
        }
    }
}

impl IdentitySource {
    /// Parses one source or a list (a composite of at least two parts, `global` excluded).
    pub(super) fn from_raw(raw: &RawIdentity) -> Result<Self, String> {
        match raw {
            RawIdentity::One(s) => s.parse(),
            RawIdentity::All(list) => {
                if list.len() < 2 {
                    return Err("a composite identity needs at least two sources".into());
                }
                let parts = list
                    .iter()
                    .map(|s| s.parse())
                    .collect::<Result<Vec<IdentitySource>, String>>()?;
                if parts.contains(&IdentitySource::Global) {
                    return Err("global cannot be part of a composite identity".into());
                }
                Ok(IdentitySource::Composite(parts))
            }
        }
    }

    /// Whether this source (or a part of it) reads a JWT claim.
    pub fn uses_jwt(&self) -> bool {
        match self {
            IdentitySource::Jwt(_) => true,
            IdentitySource::Composite(parts) => parts.iter().any(IdentitySource::uses_jwt),
            _ => false,
        }
    }

    /// The `sluice-http` layer's source for this identity; `None` for the client IP, which
    /// the layer falls back to by itself. `jwt` verifies `jwt:CLAIM` tokens (without it, a
    /// JWT source yields nothing, which the config check prevents).
    pub fn layer_source(&self, jwt: Option<&Arc<JwtVerifier>>) -> Option<LayerSource> {
        match self {
            IdentitySource::Ip => None,
            _ => Some(self.layer_part(jwt)),
        }
    }

    fn layer_part(&self, jwt: Option<&Arc<JwtVerifier>>) -> LayerSource {
        match self {
            IdentitySource::Ip => LayerSource::ClientIp,
            IdentitySource::ApiKey(h) => LayerSource::ApiKey(h.clone()),
            IdentitySource::Bearer => LayerSource::Bearer,
            IdentitySource::Header(h) => LayerSource::Header(h.clone()),
            IdentitySource::Global => {
                LayerSource::custom(|_| Some(sluice::Identity::new("global")))
            }
            IdentitySource::Cookie(c) => LayerSource::Cookie(c.clone()),
            IdentitySource::Query(q) => LayerSource::Query(q.clone()),
            IdentitySource::Jwt(claim) => match jwt {
                Some(v) => LayerSource::Jwt {
                    claim: claim.clone(),
                    verifier: Arc::clone(v),
                },
                None => LayerSource::custom(|_| None),
            },
            IdentitySource::Composite(parts) => {
                LayerSource::Composite(parts.iter().map(|p| p.layer_part(jwt)).collect())
            }
        }
    }
}

/// Checks `[jwt]` and builds its verifier; `dir` resolves a relative `public_key` path.
pub(super) fn check_jwt(
    ck: &mut Checker<'_>,
    raw: &RawConfig,
    dir: Option<&Path>,
) -> Option<Arc<JwtVerifier>> {
    let j = raw.jwt.as_ref()?.get_ref();
    let alg = match j.algorithm.get_ref().parse::<JwtAlgorithm>() {
        Ok(a) => a,
        Err(e) => {
            ck.at(j.algorithm.span(), "jwt.algorithm", e);
            return None;
        }
    };
    let key: Vec<u8> = match (alg, &j.secret, &j.public_key) {
        (JwtAlgorithm::Hs256, Some(s), None) => {
            let unset_env = ck.skip_env_secrets
                && s.get_ref()
                    .strip_prefix("env:")
                    .is_some_and(|v| std::env::var(v).is_err());
            if unset_env {
                return None;
            }
            match ck.resolve_secret(s.get_ref()) {
                Ok(v) => v.into_bytes(),
                Err(e) => {
                    ck.at(s.span(), "jwt.secret", e);
                    return None;
                }
            }
        }
        (JwtAlgorithm::Rs256 | JwtAlgorithm::Es256, None, Some(p)) => {
            let rel = Path::new(p.get_ref());
            let path = match dir {
                Some(d) if rel.is_relative() => d.join(rel),
                _ => rel.to_path_buf(),
            };
            match std::fs::read(&path) {
                Ok(b) => b,
                Err(e) => {
                    ck.at(
                        p.span(),
                        "jwt.public_key",
                        format!("{}: {e}", path.display()),
                    );
                    return None;
                }
            }
        }
        (JwtAlgorithm::Hs256, _, _) => {
            ck.at(
                j.algorithm.span(),
                "jwt",
                "HS256 takes `secret` (such as \"env:SLUICE_JWT_SECRET\") and no `public_key`",
            );
            return None;
        }
        _ => {
            ck.at(
                j.algorithm.span(),
                "jwt",
                "RS256 and ES256 take `public_key` (a PEM file) and no `secret`",
            );
            return None;
        }
    };
    let field = match alg {
        JwtAlgorithm::Hs256 => "jwt.secret",
        _ => "jwt.public_key",
    };
    let span = j
        .secret
        .as_ref()
        .or(j.public_key.as_ref())
        .map_or_else(|| j.algorithm.span(), Spanned::span);
    let mut v = match JwtVerifier::new(alg, &key) {
        Ok(v) => v,
        Err(e) => {
            ck.at(span, field, e.to_string());
            return None;
        }
    };
    let leeway = ck.duration(&j.leeway, "jwt.leeway", Duration::ZERO);
    v = v.leeway(leeway.as_secs());
    if let Some(a) = &j.audience {
        v = v.audience(a);
    }
    if let Some(i) = &j.issuer {
        v = v.issuer(i);
    }
    Some(Arc::new(v))
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::IdentitySource;
    use sluice_http::IdentitySource as Layer;

    fn parse(src: &str, dir: Option<&std::path::Path>) -> Result<Config, Vec<String>> {
        Config::parse(src, "sluice.toml", dir)
            .map_err(|e| e.0.iter().map(|e| e.to_string()).collect())
    }

    fn policy(identity: &str) -> String {
        format!(
            "[policies.p]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1m\"\nidentity = {identity}\n"
        )
    }

    const HS: &str =
        "[jwt]\nalgorithm = \"HS256\"\nsecret = \"0123456789abcdef0123456789abcdef\"\n";

    #[test]
    fn cookie_query_jwt_and_composites_parse_into_layer_sources() {
        let c = parse(&policy("\"cookie:session\""), None).unwrap();
        assert_eq!(
            c.policies["p"].identity,
            IdentitySource::Cookie("session".into())
        );
        assert!(
            matches!(&c.policies["p"].layer_identity, Some(Layer::Cookie(n)) if n == "session")
        );
        let c = parse(&policy("\"query:tenant\""), None).unwrap();
        assert!(matches!(&c.policies["p"].layer_identity, Some(Layer::Query(n)) if n == "tenant"));
        let c = parse(&format!("{HS}{}", policy("\"jwt:sub\"")), None).unwrap();
        assert!(
            matches!(&c.policies["p"].layer_identity, Some(Layer::Jwt { claim, .. }) if claim == "sub")
        );
        let c = parse(&policy("[\"ip\", \"header:x-tenant\"]"), None).unwrap();
        assert_eq!(
            c.policies["p"].identity,
            IdentitySource::Composite(vec![
                IdentitySource::Ip,
                IdentitySource::Header(http::HeaderName::from_static("x-tenant"))
            ])
        );
        assert!(matches!(
            &c.policies["p"].layer_identity,
            Some(Layer::Composite(parts)) if matches!(parts.as_slice(), [Layer::ClientIp, Layer::Header(_)])
        ));
    }

    #[test]
    fn public_keys_are_read_relative_to_the_config_file() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../http/tests/suite/fixtures");
        let src = format!(
            "[jwt]\nalgorithm = \"ES256\"\npublic_key = \"es256-public.pem\"\nleeway = \"30s\"\n{}",
            policy("\"jwt:sub\"")
        );
        let c = parse(&src, Some(&dir)).unwrap();
        assert!(matches!(
            &c.policies["p"].layer_identity,
            Some(Layer::Jwt { .. })
        ));
        // The RSA key is no ES256 key.
        let src = src.replace("es256-public.pem", "rs256-public.pem");
        let e = parse(&src, Some(&dir)).unwrap_err();
        assert!(
            e[0].contains("jwt.public_key: not an EC public key"),
            "{e:?}"
        );
    }

    #[test]
    fn bad_identities_and_jwt_keys_are_clear_errors() {
        let cases: &[(String, &str)] = &[
            (policy("\"jwt:sub\""), "needs a [jwt] key"),
            (policy("\"cookie:\""), "invalid cookie name"),
            (policy("\"query:a b\""), "invalid query parameter name"),
            (policy("[\"ip\"]"), "at least two sources"),
            (policy("[\"ip\", \"global\"]"), "global cannot be part"),
            (policy("[\"ip\", \"nope\"]"), "unknown identity source"),
            (
                "[jwt]\nalgorithm = \"HS256\"\nsecret = \"short\"\n".to_string(),
                "at least 32 bytes",
            ),
            (
                "[jwt]\nalgorithm = \"HS512\"\nsecret = \"x\"\n".to_string(),
                "unsupported JWT algorithm",
            ),
            (
                "[jwt]\nalgorithm = \"RS256\"\nsecret = \"x\"\n".to_string(),
                "take `public_key`",
            ),
            (
                "[jwt]\nalgorithm = \"HS256\"\npublic_key = \"k.pem\"\n".to_string(),
                "HS256 takes `secret`",
            ),
            (
                "[jwt]\nalgorithm = \"ES256\"\npublic_key = \"/nonexistent/k.pem\"\n".to_string(),
                "/nonexistent/k.pem",
            ),
        ];
        for (src, want) in cases {
            let e = parse(src, None).unwrap_err();
            assert!(e.len() == 1 && e[0].contains(want), "{src}\n{e:?}");
        }
    }
}
