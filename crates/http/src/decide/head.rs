//! [`RequestHead`]: a request's method, target, headers and peer as any framework hands them
//! over, read into `http` types once, so the Python and Node middleware give the
//! [`super::Decider`] the same head the tower layer has (and a head that cannot be read
//! becomes the same `400`).

use std::net::{IpAddr, SocketAddr};

use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};

use super::Refusal;

/// A request head as any framework has it, owned so it can move to the runtime that decides.
#[derive(Debug, Clone)]
pub struct RequestHead {
    /// The method.
    pub method: Method,
    /// The target as received: the path (not percent-decoded) and the query.
    pub uri: Uri,
    /// Every header line.
    pub headers: HeaderMap,
    /// The socket peer; `None` (a Unix socket, a test client) limits by `ip:unknown` when no
    /// other identity source applies.
    pub peer: Option<SocketAddr>,
}

impl RequestHead {
    /// A head from what a Python or Node framework hands over: the method, the raw target
    /// (`/path?query`, not percent-decoded), the raw header list and the peer's address
    /// (`203.0.113.7`, `::ffff:127.0.0.1`, `[2001:db8::1]` or with a port). A header the
    /// `http` crate cannot represent is skipped (no identity source could read it); a peer
    /// that is not an address counts as none. An invalid method or a target that is not a
    /// request target gives the `400` problem+json refusal to send back.
    pub fn from_raw<N, V>(
        method: &str,
        target: &str,
        headers: impl IntoIterator<Item = (N, V)>,
        peer: Option<&str>,
    ) -> Result<Self, Refusal>
    where
        N: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let method = Method::from_bytes(method.as_bytes())
            .map_err(|_| Refusal::bad_request(&format!("invalid HTTP method {method:?}")))?;
        let uri = target
            .parse::<Uri>()
            .ok()
            .filter(|u| target.starts_with('/') || u.scheme().is_some())
            .ok_or_else(|| Refusal::bad_request(&format!("invalid request target {target:?}")))?;
        let mut map = HeaderMap::new();
        for (n, v) in headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(n.as_ref()),
                HeaderValue::from_bytes(v.as_ref()),
            ) {
                map.append(n, v);
            }
        }
        Ok(Self {
            method,
            uri,
            headers: map,
            peer: peer.and_then(parse_peer),
        })
    }

    /// The [`Parts`] of a request with this head (the peer as a `SocketAddr` extension, where
    /// the client-IP identity looks for it).
    pub fn into_parts(self) -> Parts {
        let mut req = http::Request::new(());
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        *req.headers_mut() = self.headers;
        if let Some(peer) = self.peer {
            req.extensions_mut().insert(peer);
        }
        req.into_parts().0
    }
}

/// `203.0.113.7`, `[::1]`, `[::1]:8080`, `203.0.113.7:80`, `::ffff:127.0.0.1`.
fn parse_peer(peer: &str) -> Option<SocketAddr> {
    let peer = peer.trim();
    if let Ok(addr) = peer.parse::<SocketAddr>() {
        return Some(addr);
    }
    peer.trim_matches(['[', ']'])
        .parse::<IpAddr>()
        .ok()
        .map(|ip| SocketAddr::new(ip, 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::Outcome;
    use http::StatusCode;

    #[test]
    fn peers_are_read_in_every_spelling_frameworks_use() {
        let ip = |s| parse_peer(s).map(|a| a.ip().to_string());
        assert_eq!(ip("203.0.113.7").as_deref(), Some("203.0.113.7"));
        assert_eq!(ip("203.0.113.7:8080").as_deref(), Some("203.0.113.7"));
        assert_eq!(ip("::ffff:127.0.0.1").as_deref(), Some("::ffff:127.0.0.1"));
        assert_eq!(ip("[2001:db8::1]").as_deref(), Some("2001:db8::1"));
        assert_eq!(ip("[2001:db8::1]:443").as_deref(), Some("2001:db8::1"));
        assert_eq!(ip("unix:/tmp/s"), None);
    }

    #[test]
    fn unreadable_heads_are_refused_with_400() {
        let none: [(&str, &str); 0] = [];
        let bad = RequestHead::from_raw("G ET", "/", none, None).unwrap_err();
        assert_eq!(bad.status, StatusCode::BAD_REQUEST);
        assert_eq!(bad.outcome, Outcome::BadPath);
        let bad = RequestHead::from_raw("GET", "no slash", none, None).unwrap_err();
        assert_eq!(bad.status, StatusCode::BAD_REQUEST);
        let ok =
            RequestHead::from_raw("GET", "/a?b=1", [("x-k", "v"), ("bad\n", "x")], Some("::1"))
                .unwrap();
        assert_eq!(ok.uri.path(), "/a");
        assert_eq!(ok.headers.len(), 1);
        assert_eq!(ok.peer.map(|p| p.ip().to_string()).as_deref(), Some("::1"));
    }
}
