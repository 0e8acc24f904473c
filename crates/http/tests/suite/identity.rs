//! Identities: the client address behind trusted proxies, its grouping, and the sources
//! tried before it (hashed credentials, headers as is, extensions, closures).

use std::net::{IpAddr, SocketAddr};

use axum::extract::ConnectInfo;
use http::HeaderMap;
use sluice::Identity;
use sluice_http::identity::{
    ClientIpConfig, IdentityResolver, IdentitySource, TrustedProxies, forwarded_chain,
    header_identity,
};

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in pairs {
        h.append(*n, v.parse().unwrap());
    }
    h
}
fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}
fn cfg(trusted: TrustedProxies) -> ClientIpConfig {
    ClientIpConfig {
        trusted,
        ..Default::default()
    }
}

#[test]
fn untrusted_peers_cannot_choose_their_address() {
    let c = cfg(TrustedProxies::None);
    let h = headers(&[
        ("x-forwarded-for", "1.2.3.4"),
        ("forwarded", "for=1.2.3.4"),
        ("x-real-ip", "1.2.3.4"),
    ]);
    assert_eq!(c.client_ip(ip("198.51.100.9"), &h), ip("198.51.100.9"));
    // A trusted list that does not contain the peer is the same.
    let c = cfg(TrustedProxies::cidrs(&["10.0.0.0/8"]).unwrap());
    assert_eq!(c.client_ip(ip("198.51.100.9"), &h), ip("198.51.100.9"));
}

#[test]
fn right_most_untrusted_address_wins() {
    let c = cfg(TrustedProxies::cidrs(&["10.0.0.0/8", "192.168.0.1"]).unwrap());
    // One proxy.
    let h = headers(&[("x-forwarded-for", "203.0.113.7")]);
    assert_eq!(c.client_ip(ip("10.0.0.1"), &h), ip("203.0.113.7"));
    // Two proxies; the client prepended a lie.
    let h = headers(&[("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.1.1.1")]);
    assert_eq!(c.client_ip(ip("192.168.0.1"), &h), ip("203.0.113.7"));
    // Several header lines are one list.
    let h = headers(&[
        ("x-forwarded-for", "6.6.6.6"),
        ("x-forwarded-for", "203.0.113.7:5555"),
    ]);
    assert_eq!(c.client_ip(ip("10.0.0.1"), &h), ip("203.0.113.7"));
    // No header: the proxy itself.
    assert_eq!(
        c.client_ip(ip("10.0.0.1"), &HeaderMap::new()),
        ip("10.0.0.1")
    );
    // X-Real-IP when nothing else.
    let h = headers(&[("x-real-ip", "203.0.113.8")]);
    assert_eq!(c.client_ip(ip("10.0.0.1"), &h), ip("203.0.113.8"));
    // An unreadable hop stops at the last trusted proxy.
    let h = headers(&[("x-forwarded-for", "203.0.113.7, garbage, 10.1.1.1")]);
    assert_eq!(c.client_ip(ip("10.0.0.1"), &h), ip("10.1.1.1"));
}

#[test]
fn forwarded_header_is_parsed() {
    let h = headers(&[(
        "forwarded",
        "for=6.6.6.6;proto=http, For=\"[2001:db8:cafe::17]:4711\";by=10.0.0.2, for=unknown, proto=https",
    )]);
    assert_eq!(
        forwarded_chain(&h),
        vec![
            Some(ip("6.6.6.6")),
            Some(ip("2001:db8:cafe::17")),
            None,
            None
        ]
    );
    let c = cfg(TrustedProxies::cidrs(&["10.0.0.0/8"]).unwrap());
    let h = headers(&[
        ("forwarded", "for=6.6.6.6, for=\"203.0.113.7:80\""),
        ("x-forwarded-for", "1.1.1.1"),
    ]);
    assert_eq!(c.client_ip(ip("10.0.0.1"), &h), ip("203.0.113.7"));
}

#[test]
fn hop_count() {
    let h = headers(&[("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.1.1.1")]);
    assert_eq!(
        cfg(TrustedProxies::Hops(0)).client_ip(ip("10.0.0.1"), &h),
        ip("10.0.0.1")
    );
    assert_eq!(
        cfg(TrustedProxies::Hops(1)).client_ip(ip("10.0.0.1"), &h),
        ip("10.1.1.1")
    );
    assert_eq!(
        cfg(TrustedProxies::Hops(2)).client_ip(ip("10.0.0.1"), &h),
        ip("203.0.113.7")
    );
    assert_eq!(
        cfg(TrustedProxies::Hops(9)).client_ip(ip("10.0.0.1"), &h),
        ip("6.6.6.6")
    );
    assert_eq!(
        cfg(TrustedProxies::Hops(1)).client_ip(ip("10.0.0.1"), &HeaderMap::new()),
        ip("10.0.0.1")
    );
}

#[test]
fn grouping() {
    let c = ClientIpConfig::default();
    assert_eq!(c.group(ip("203.0.113.7")).as_str(), "ip:203.0.113.7");
    assert_eq!(c.group(ip("::ffff:203.0.113.7")).as_str(), "ip:203.0.113.7");
    assert_eq!(
        c.group(ip("2001:db8:1:2:aaaa::1")).as_str(),
        "ip6:2001:db8:1:2::/64"
    );
    assert_eq!(
        c.group(ip("2001:db8:1:2:bbbb::9")),
        c.group(ip("2001:db8:1:2:aaaa::1"))
    );
    assert_ne!(
        c.group(ip("2001:db8:1:3::1")),
        c.group(ip("2001:db8:1:2::1"))
    );
    let c = ClientIpConfig {
        ipv6_prefix: 48,
        ipv4_prefix: 24,
        ..Default::default()
    };
    assert_eq!(
        c.group(ip("2001:db8:1:2::1")).as_str(),
        "ip6:2001:db8:1::/48"
    );
    assert_eq!(c.group(ip("203.0.113.7")).as_str(), "ip:203.0.113.0/24");
    let c = ClientIpConfig {
        ipv6_prefix: 128,
        ..Default::default()
    };
    assert_eq!(c.group(ip("2001:db8::1")).as_str(), "ip6:2001:db8::1");
}

#[test]
fn sources_in_order_then_ip() {
    let key = [7u8; 32];
    let r = IdentityResolver::new(
        vec![
            IdentitySource::api_key("x-api-key"),
            IdentitySource::Bearer,
            IdentitySource::Extension,
        ],
        key,
        ClientIpConfig::default(),
    );
    let req = |pairs: &[(&'static str, &str)]| {
        let mut b = http::Request::builder();
        for (n, v) in pairs {
            b = b.header(*n, *v);
        }
        let (mut parts, ()) = b.body(()).unwrap().into_parts();
        parts.extensions.insert(ConnectInfo(
            "198.51.100.9:1234".parse::<SocketAddr>().unwrap(),
        ));
        parts
    };
    let id = r.resolve(&req(&[
        ("x-api-key", "sk_live_1"),
        ("authorization", "Bearer t"),
    ]));
    assert_eq!(id, Identity::credential("key", b"sk_live_1", &key));
    assert!(!id.as_str().contains("sk_live"));
    let id = r.resolve(&req(&[("authorization", "bearer  tok ")]));
    assert_eq!(id, Identity::credential("bearer", b"tok", &key));
    let mut p = req(&[("x-api-key", "")]);
    p.extensions.insert(Identity::new("user:42"));
    assert_eq!(r.resolve(&p).as_str(), "user:42");
    assert_eq!(r.resolve(&req(&[])).as_str(), "ip:198.51.100.9");
    let custom = IdentityResolver::new(
        vec![IdentitySource::custom(|p| {
            p.uri.query().map(|q| Identity::new(format!("q:{q}")))
        })],
        key,
        ClientIpConfig::default(),
    );
    let (mut parts, ()) = http::Request::get("/x?tenant")
        .body(())
        .unwrap()
        .into_parts();
    assert_eq!(custom.resolve(&parts).as_str(), "q:tenant");
    parts.uri = "/x".parse().unwrap();
    assert_eq!(custom.resolve(&parts).as_str(), "ip:unknown");
}

/// A request head from 198.51.100.9 carrying `x-user: <value>`.
fn from_peer_with_user(value: &[u8]) -> http::request::Parts {
    let (mut parts, ()) = http::Request::get("/")
        .header("x-user", http::HeaderValue::from_bytes(value).unwrap())
        .body(())
        .unwrap()
        .into_parts();
    parts.extensions.insert(ConnectInfo(
        "198.51.100.9:1234".parse::<SocketAddr>().unwrap(),
    ));
    parts
}

#[test]
fn header_values_beyond_plain_text_get_buckets_of_their_own() {
    let key = [9u8; 32];
    let r = IdentityResolver::new(
        vec![IdentitySource::header("x-user")],
        key,
        ClientIpConfig::default(),
    );
    let ip_id = r.resolve(&from_peer_with_user(b"")); // empty: falls through to the IP
    assert_eq!(ip_id.as_str(), "ip:198.51.100.9");

    assert_eq!(
        r.resolve(&from_peer_with_user(b"user-7")).as_str(),
        "hdr:user-7"
    );

    // Bytes that are not visible ASCII (obs-text; not UTF-8 here) are hashed, raw.
    let a = r.resolve(&from_peer_with_user(b"\xffalice"));
    let b = r.resolve(&from_peer_with_user(b"\xffbob"));
    assert_ne!(a, b);
    assert_ne!(a, ip_id);
    assert_ne!(b, ip_id);
    assert_eq!(a, Identity::credential("hdr-hash", b"\xffalice", &key));
    assert!(a.as_str().starts_with("hdr-hash:h"), "{a}");
    // The hash is keyed: another key, another identity.
    assert_ne!(header_identity(b"\xffalice", &[1u8; 32]), Some(a.clone()));

    // 512 bytes are used as is; 600 are hashed, each value distinct and bounded.
    let at_limit = vec![b'u'; 512];
    assert_eq!(
        r.resolve(&from_peer_with_user(&at_limit)).as_str().len(),
        4 + 512
    );
    let long_u = r.resolve(&from_peer_with_user(&[b'u'; 600]));
    let long_v = r.resolve(&from_peer_with_user(&[b'v'; 600]));
    assert_ne!(long_u, long_v);
    assert_ne!(long_u, ip_id);
    assert!(long_u.as_str().len() < 64, "{long_u}");
    // A plain value cannot spell a hashed one: the prefixes differ.
    let spelled = r.resolve(&from_peer_with_user(
        long_u.as_str().trim_start_matches("hdr-hash:").as_bytes(),
    ));
    assert_ne!(spelled, long_u);
}
