//! Who a request is limited as.
//!
//! A limiter is only as good as its key: an identity the client can choose is no limit at
//! all, and an identity shared by everyone (the load balancer's address) limits everyone
//! together. So:
//!
//! - Credentials (an API key header, a bearer token) are used when present, **hashed** with
//!   [`Identity::credential`] under a configurable 32-byte key, so key names, logs and
//!   `MONITOR` sessions never show a secret.
//! - The application can supply the identity itself: a closure over the request head, or a
//!   [`sluice::Identity`] request extension set by an authentication layer that runs first.
//! - Otherwise the client IP. Forwarding headers (`Forwarded`, `X-Forwarded-For`,
//!   `X-Real-IP`) are read **only** when the socket peer is a trusted proxy, and then the
//!   client is the right-most address that is not itself a trusted proxy: every address left
//!   of that was written by the client and proves nothing. IPv6 clients usually hold a whole
//!   /64, so they are grouped by a prefix (default /64); IPv4 addresses by /32.
//!
//! - Cookies and query parameters ([`request`]), verified JWT claims ([`jwt`]; a token that
//!   does not verify yields nothing, so the request falls back to the client IP), and
//!   composites of several sources, all resolved to one identity each.
//!
//! The socket peer comes from axum's `ConnectInfo<SocketAddr>` extension (serve with
//! `into_make_service_with_connect_info::<SocketAddr>()`) or a plain `SocketAddr` extension
//! (plain hyper services insert it themselves).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::ConnectInfo;
use http::request::Parts;
use http::{HeaderMap, HeaderName};
use ipnet::IpNet;
use sluice::Identity;
use sluice::core::ClientNet;

pub mod jwt;
pub mod request;

pub use jwt::{JwtAlgorithm, JwtKeyError, JwtVerifier};

/// A closure deriving an identity from the request head.
pub type IdentityFn = Arc<dyn Fn(&Parts) -> Option<Identity> + Send + Sync>;

/// One way of finding the identity; sources are tried in order, the client IP last.
#[derive(Clone)]
pub enum IdentitySource {
    /// The value of this header (e.g. `x-api-key`), hashed: `key:h<hex>`.
    ApiKey(HeaderName),
    /// The value of this header as is (`hdr:<value>`), e.g. a user id set by an
    /// authenticating gateway; see [`header_identity`] for values that are not plain text.
    Header(HeaderName),
    /// The token of `Authorization: Bearer <token>`, hashed: `bearer:h<hex>`.
    Bearer,
    /// A [`sluice::Identity`] request extension set by an earlier (authentication) layer.
    Extension,
    /// Whatever the closure answers; `None` falls through to the next source.
    Custom(IdentityFn),
    /// The value of this cookie, always hashed: `cookie:h<hex>` (session cookies are
    /// credentials).
    Cookie(String),
    /// The value of this query parameter, like a header: `qry:<value>`, or
    /// `qry-hash:h<hex>` when long or not printable.
    Query(String),
    /// A claim of the `Authorization: Bearer` JWT, only when the token verifies:
    /// `jwt-<claim>:<value>` (or `jwt-<claim>-hash:h<hex>`). A token that is malformed,
    /// badly signed, expired or not yet valid yields nothing.
    Jwt {
        /// The claim whose value is the identity (`sub`, `tenant`...).
        claim: String,
        /// Checks the token before its claim is read.
        verifier: Arc<JwtVerifier>,
    },
    /// The client address (after trusted proxies), as a source of its own: useful as a part
    /// of a [`IdentitySource::Composite`].
    ClientIp,
    /// Every part, in order, joined into one identity
    /// ([`request::composite_identity`]); when any part is missing, the composite yields
    /// nothing (the next source, finally the client IP, decides).
    Composite(Vec<IdentitySource>),
}

impl IdentitySource {
    /// An API key header, hashed before use.
    pub fn api_key(header: &'static str) -> Self {
        IdentitySource::ApiKey(HeaderName::from_static(header))
    }
    /// A header's value, used as is.
    pub fn header(header: &'static str) -> Self {
        IdentitySource::Header(HeaderName::from_static(header))
    }
    /// A verified JWT claim.
    pub fn jwt(claim: impl Into<String>, verifier: JwtVerifier) -> Self {
        IdentitySource::Jwt {
            claim: claim.into(),
            verifier: Arc::new(verifier),
        }
    }
    /// A closure over the request head.
    pub fn custom(f: impl Fn(&Parts) -> Option<Identity> + Send + Sync + 'static) -> Self {
        IdentitySource::Custom(Arc::new(f))
    }
}

impl fmt::Debug for IdentitySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdentitySource::ApiKey(h) => f.debug_tuple("ApiKey").field(h).finish(),
            IdentitySource::Header(h) => f.debug_tuple("Header").field(h).finish(),
            IdentitySource::Bearer => f.write_str("Bearer"),
            IdentitySource::Extension => f.write_str("Extension"),
            IdentitySource::Custom(_) => f.write_str("Custom(..)"),
            IdentitySource::Cookie(n) => f.debug_tuple("Cookie").field(n).finish(),
            IdentitySource::Query(n) => f.debug_tuple("Query").field(n).finish(),
            IdentitySource::Jwt { claim, verifier } => f
                .debug_struct("Jwt")
                .field("claim", claim)
                .field("verifier", verifier)
                .finish(),
            IdentitySource::ClientIp => f.write_str("ClientIp"),
            IdentitySource::Composite(parts) => f.debug_tuple("Composite").field(parts).finish(),
        }
    }
}

/// Which socket peers may tell us the client address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum TrustedProxies {
    /// Nobody: the client is the socket peer and forwarding headers are ignored (default).
    #[default]
    None,
    /// Peers (and forwarding hops) inside these networks are our proxies.
    Cidrs(Vec<IpNet>),
    /// Exactly this many proxies sit in front of us (Express's `trust proxy = N`): the client
    /// is the N-th address from the right of `forwarded addresses + socket peer`.
    Hops(usize),
}

impl TrustedProxies {
    /// Parses a list such as `["10.0.0.0/8", "192.168.1.7", "fd00::/8"]` (bare addresses are
    /// single hosts).
    pub fn cidrs<S: AsRef<str>>(list: &[S]) -> Result<Self, ipnet::AddrParseError> {
        let mut nets = Vec::with_capacity(list.len());
        for s in list {
            let s = s.as_ref().trim();
            let net = match s.parse::<IpNet>() {
                Ok(n) => n,
                Err(e) => match s.parse::<IpAddr>() {
                    Ok(ip) => IpNet::from(ip),
                    Err(_) => return Err(e),
                },
            };
            nets.push(net.trunc());
        }
        Ok(TrustedProxies::Cidrs(nets))
    }

    fn contains(&self, ip: IpAddr) -> bool {
        match self {
            TrustedProxies::Cidrs(nets) => nets.iter().any(|n| n.contains(&ip)),
            _ => false,
        }
    }
}

/// How the client IP is found and grouped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIpConfig {
    /// Which peers may set forwarding headers.
    pub trusted: TrustedProxies,
    /// IPv6 addresses are grouped by this prefix length (default 64).
    pub ipv6_prefix: u8,
    /// IPv4 addresses are grouped by this prefix length (default 32).
    pub ipv4_prefix: u8,
}

impl Default for ClientIpConfig {
    fn default() -> Self {
        Self {
            trusted: TrustedProxies::None,
            ipv6_prefix: 64,
            ipv4_prefix: 32,
        }
    }
}

impl ClientIpConfig {
    /// The client address of a request from `peer` with `headers`.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = peer.to_canonical();
        match &self.trusted {
            TrustedProxies::None => peer,
            TrustedProxies::Cidrs(_) => {
                if !self.trusted.contains(peer) {
                    return peer;
                }
                let chain = forwarded_chain(headers);
                // Walk from the right; the first hop we do not trust is the client. An
                // unreadable hop ("unknown", an obfuscated name) stops the walk at the last
                // proxy we trust, which then stands for everyone behind it.
                let mut last = peer;
                for hop in chain.iter().rev() {
                    match hop {
                        Some(ip) if self.trusted.contains(*ip) => last = *ip,
                        Some(ip) => return *ip,
                        None => return last,
                    }
                }
                last
            }
            TrustedProxies::Hops(n) => {
                if *n == 0 {
                    return peer;
                }
                let chain = forwarded_chain(headers);
                // addresses = chain + [peer]; the client is n from the right, or the left-most.
                let idx = chain.len().saturating_sub(*n);
                match chain.get(idx) {
                    Some(Some(ip)) => *ip,
                    Some(None) => chain[idx + 1..]
                        .iter()
                        .flatten()
                        .next()
                        .copied()
                        .unwrap_or(peer),
                    None => peer,
                }
            }
        }
    }

    /// The identity of a client address: `ip:203.0.113.7`, `ip6:2001:db8:1:2::/64`, or the
    /// network when the prefix is shorter than the address (`ip:203.0.113.0/24`). It carries
    /// the address (or group), typed, for the control plane's network lists.
    pub fn group(&self, ip: IpAddr) -> Identity {
        let prefix = if ip.to_canonical().is_ipv4() {
            self.ipv4_prefix
        } else {
            self.ipv6_prefix
        };
        Identity::client_ip(ClientNet::new(ip, prefix))
    }
}

/// The socket peer of a request, from axum's `ConnectInfo` or a `SocketAddr` extension.
pub fn peer_addr(extensions: &http::Extensions) -> Option<SocketAddr> {
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0)
        .or_else(|| extensions.get::<SocketAddr>().copied())
}

/// The forwarded addresses, left (client side) to right (nearest proxy). `Forwarded` wins
/// over `X-Forwarded-For`, which wins over `X-Real-IP`: a proxy that writes the standard
/// header is more recent than one that writes the older ones. `None` marks a hop that is not
/// an address (`unknown`, obfuscated, unparsable).
pub fn forwarded_chain(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let mut out = Vec::new();
    let fwd = headers.get_all(http::header::FORWARDED);
    if fwd.iter().next().is_some() {
        for v in fwd {
            match v.to_str() {
                Ok(s) => parse_forwarded(s, &mut out),
                Err(_) => out.push(None),
            }
        }
        return out;
    }
    let xff = headers.get_all("x-forwarded-for");
    if xff.iter().next().is_some() {
        for v in xff {
            match v.to_str() {
                Ok(s) => out.extend(s.split(',').filter_map(|e| parse_node(e.trim()))),
                Err(_) => out.push(None),
            }
        }
        return out;
    }
    if let Some(v) = headers.get("x-real-ip") {
        out.push(v.to_str().ok().and_then(|s| parse_node(s.trim())).flatten());
    }
    out
}

/// Parses one node: `203.0.113.7`, `203.0.113.7:443`, `2001:db8::1`, `[2001:db8::1]:443`.
/// `None` for an empty entry (skipped), `Some(None)` for a hop that is not an address.
fn parse_node(s: &str) -> Option<Option<IpAddr>> {
    let s = s.trim_matches('"');
    if s.is_empty() {
        return None;
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(Some(ip.to_canonical()));
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Some(Some(sa.ip().to_canonical()));
    }
    if let Some(Ok(ip)) = s
        .strip_prefix('[')
        .and_then(|r| r.split(']').next())
        .map(str::parse::<IpAddr>)
    {
        return Some(Some(ip.to_canonical()));
    }
    Some(None)
}

/// Parses an RFC 7239 `Forwarded` value: elements separated by `,`, pairs by `;`, values
/// tokens or quoted strings; only `for=` matters here. An element without `for` is a hop we
/// cannot read.
fn parse_forwarded(s: &str, out: &mut Vec<Option<IpAddr>>) {
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut element_for: Option<Option<IpAddr>> = None;
    let mut element_seen = false;
    while i <= bytes.len() {
        // Read one pair `name=value` up to `;`, `,` or the end.
        while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b'\t') {
            i += 1;
        }
        let name_start = i;
        while i < bytes.len() && !matches!(bytes[i], b'=' | b';' | b',') {
            i += 1;
        }
        let name = s[name_start..i].trim();
        let mut val = String::new();
        if i < bytes.len() && bytes[i] == b'=' {
            i += 1;
            if i < bytes.len() && bytes[i] == b'"' {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    if bytes[i] == b'\\' && i + 1 < bytes.len() {
                        i += 1;
                    }
                    val.push(bytes[i] as char);
                    i += 1;
                }
                i += 1; // closing quote
                while i < bytes.len() && !matches!(bytes[i], b';' | b',') {
                    i += 1;
                }
            } else {
                let vs = i;
                while i < bytes.len() && !matches!(bytes[i], b';' | b',') {
                    i += 1;
                }
                val.push_str(s[vs..i].trim());
            }
        }
        if !name.is_empty() {
            element_seen = true;
            if name.eq_ignore_ascii_case("for") {
                element_for = Some(parse_node(&val).flatten());
            }
        }
        let end_of_element = i >= bytes.len() || bytes[i] == b',';
        if end_of_element {
            if element_seen {
                out.push(element_for.flatten());
            }
            element_for = None;
            element_seen = false;
        }
        i += 1;
    }
}

/// The identity of an API key: `key:h<hex>`, its keyed hash. [`IdentitySource::ApiKey`]
/// limits a request as this, and `sluice serve`'s decision API turns a `credential` into the
/// same, so an app calling the API and the proxy in front of it share one bucket per key.
pub fn api_key_identity(secret: &[u8], hash_key: &[u8; 32]) -> Identity {
    Identity::credential("key", secret, hash_key)
}

/// The identity of a header used as is: `hdr:<value>` for printable ASCII (and tab) up to
/// [`sluice::core::key::MAX_IDENTITY_LEN`] bytes. Any other value (bytes beyond ASCII, or longer) is a keyed hash
/// of its raw bytes, `hdr-hash:h<hex>`: every distinct value keeps a bucket of its own, the
/// key stays bounded, and no value can spell the hashed form of another or a client-IP
/// identity. `None` for an empty value (the next source decides).
pub fn header_identity(value: &[u8], hash_key: &[u8; 32]) -> Option<Identity> {
    request::plain_or_hashed("hdr", value, hash_key)
}

/// Derives identities from requests: the configured sources in order, then the client IP.
#[derive(Clone)]
pub struct IdentityResolver {
    sources: Vec<IdentitySource>,
    hash_key: [u8; 32],
    client_ip: ClientIpConfig,
}

impl fmt::Debug for IdentityResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the hash key.
        f.debug_struct("IdentityResolver")
            .field("sources", &self.sources)
            .field("client_ip", &self.client_ip)
            .finish_non_exhaustive()
    }
}

impl Default for IdentityResolver {
    fn default() -> Self {
        Self::new(
            Vec::new(),
            sluice::core::key::default_hash_key(),
            ClientIpConfig::default(),
        )
    }
}

impl IdentityResolver {
    /// A resolver trying `sources` in order, then the client IP.
    pub fn new(
        sources: Vec<IdentitySource>,
        hash_key: [u8; 32],
        client_ip: ClientIpConfig,
    ) -> Self {
        Self {
            sources,
            hash_key,
            client_ip,
        }
    }

    /// The client IP settings.
    pub fn client_ip_config(&self) -> &ClientIpConfig {
        &self.client_ip
    }

    /// The identity of a request.
    pub fn resolve(&self, parts: &Parts) -> Identity {
        self.sources
            .iter()
            .find_map(|source| self.from_source(source, parts))
            .unwrap_or_else(|| self.client_identity(parts))
    }

    /// What one source says about a request; `None` when it has nothing to say.
    pub fn from_source(&self, source: &IdentitySource, parts: &Parts) -> Option<Identity> {
        let key = &self.hash_key;
        match source {
            IdentitySource::ApiKey(h) => parts
                .headers
                .get(h)
                .map(|v| v.as_bytes())
                .filter(|v| !v.is_empty())
                .map(|v| api_key_identity(v, key)),
            IdentitySource::Header(h) => parts
                .headers
                .get(h)
                .and_then(|v| header_identity(v.as_bytes(), key)),
            IdentitySource::Bearer => {
                bearer_of(parts).map(|t| Identity::credential("bearer", t, key))
            }
            IdentitySource::Extension => parts.extensions.get::<Identity>().cloned(),
            IdentitySource::Custom(f) => f(parts),
            IdentitySource::Cookie(name) => request::cookie_value(&parts.headers, name)
                .and_then(|v| request::cookie_identity(v, key)),
            IdentitySource::Query(name) => request::query_value(parts.uri.query(), name)
                .and_then(|v| request::query_identity(&v, key)),
            IdentitySource::Jwt { claim, verifier } => {
                let value = verifier.claim(bearer_of(parts)?, claim)?;
                request::plain_or_hashed(&format!("jwt-{claim}"), value.as_bytes(), key)
            }
            IdentitySource::ClientIp => Some(self.client_identity(parts)),
            IdentitySource::Composite(sources) => {
                let found = sources
                    .iter()
                    .map(|s| self.from_source(s, parts))
                    .collect::<Option<Vec<_>>>()?;
                Some(request::composite_identity(&found, key))
            }
        }
    }

    /// The identity of the request's client address (after trusted proxies).
    pub fn client_identity(&self, parts: &Parts) -> Identity {
        match peer_addr(&parts.extensions) {
            Some(peer) => self
                .client_ip
                .group(self.client_ip.client_ip(peer.ip(), &parts.headers)),
            // No socket address was made available: everyone without credentials shares one
            // bucket, which is safe (never more traffic than configured) but coarse.
            None => Identity::new("ip:unknown"),
        }
    }
}

fn bearer_of(parts: &Parts) -> Option<&[u8]> {
    parts
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| bearer_token(v.as_bytes()))
}

/// The token of an `Authorization: Bearer <token>` value (scheme case-insensitive).
fn bearer_token(v: &[u8]) -> Option<&[u8]> {
    if v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ") {
        let t = v[7..].trim_ascii();
        (!t.is_empty()).then_some(t)
    } else {
        None
    }
}
