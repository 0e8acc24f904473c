//! Cookie, query, verified-JWT and composite identities through the layer over real HTTP
//! on 127.0.0.1:0. Every policy admits 2 requests a minute per identity, so a third request
//! on the same identity is refused and a request on a fresh identity is admitted.

use crate::support;

use axum::routing::get as route;
use axum::{Extension, Router};
use jsonwebtoken::{Algorithm as JwtAlg, EncodingKey, Header};
use serde_json::json;
use sluice::{Algorithm, Limiter, Policy};
use sluice_http::identity::{IdentitySource, JwtVerifier};
use sluice_http::{RateLimitIdentity, RateLimitLayer, Rule, TrustedProxies};
use support::{get, serve};

const SECRET: &[u8] = b"an-hs256-test-secret-of-32-bytes!!";
const ES_PRIVATE: &[u8] = include_bytes!("fixtures/es256-private.pem");
const ES_PUBLIC: &[u8] = include_bytes!("fixtures/es256-public.pem");
const RS_PRIVATE: &[u8] = include_bytes!("fixtures/rs256-private.pem");
const RS_PUBLIC: &[u8] = include_bytes!("fixtures/rs256-public.pem");

/// The clock the verifier checks `exp` and `nbf` against.
fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

fn two_a_minute() -> Policy {
    Policy::new(
        "per-identity",
        Algorithm::FixedWindow {
            limit: 2,
            window_ms: 60_000,
        },
    )
    .unwrap()
}

async fn whoami(Extension(RateLimitIdentity(id)): Extension<RateLimitIdentity>) -> String {
    id.to_string()
}

/// Serves `/whoami` behind a layer limiting on `source` (then the client IP).
async fn app(source: IdentitySource) -> std::net::SocketAddr {
    let layer = RateLimitLayer::builder(Limiter::memory())
        .rule(Rule::new("/").policy(two_a_minute()))
        .identity(source)
        // The test peer (127.0.0.1) is a trusted proxy, so X-Forwarded-For picks the client.
        .trusted_proxies(TrustedProxies::cidrs(&["127.0.0.1"]).unwrap())
        .build();
    serve(Router::new().route("/whoami", route(whoami)).layer(layer)).await
}

fn sign(alg: JwtAlg, key: &EncodingKey, claims: serde_json::Value) -> String {
    jsonwebtoken::encode(&Header::new(alg), &claims, key).unwrap()
}

fn hs(claims: serde_json::Value) -> String {
    sign(
        JwtAlg::HS256,
        &EncodingKey::from_secret(SECRET).unwrap(),
        claims,
    )
}

/// The statuses of `n` requests with `headers`.
async fn statuses(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    n: usize,
) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(get(addr, path, headers).await.status.as_u16());
    }
    out
}

#[tokio::test]
async fn a_valid_hs256_token_is_limited_on_its_claim() {
    let addr = app(IdentitySource::jwt(
        "sub",
        JwtVerifier::hs256(SECRET).unwrap(),
    ))
    .await;
    let alice = format!("Bearer {}", hs(json!({"sub": "alice", "exp": now() + 600})));
    let r = get(addr, "/whoami", &[("authorization", &alice)]).await;
    assert_eq!(r.text(), "jwt-sub:alice");
    assert_eq!(
        statuses(addr, "/whoami", &[("authorization", &alice)], 2).await,
        [200, 429]
    );
    // Another subject has a bucket of its own, from the same address.
    let bob = format!("Bearer {}", hs(json!({"sub": "bob", "exp": now() + 600})));
    assert_eq!(
        statuses(addr, "/whoami", &[("authorization", &bob)], 3).await,
        [200, 200, 429]
    );
    // And the address's own bucket was never touched.
    assert_eq!(get(addr, "/whoami", &[]).await.text(), "ip:127.0.0.1");
}

#[tokio::test]
async fn a_badly_signed_token_is_limited_on_the_client_ip_not_its_claim() {
    let addr = app(IdentitySource::jwt(
        "sub",
        JwtVerifier::hs256(SECRET).unwrap(),
    ))
    .await;
    let forged = sign(
        JwtAlg::HS256,
        &EncodingKey::from_secret(b"some-other-secret-also-32-bytes-long").unwrap(),
        json!({"sub": "victim", "exp": now() + 600}),
    );
    let forged = format!("Bearer {forged}");
    for ip in ["203.0.113.1", "203.0.113.2"] {
        let h = [("authorization", forged.as_str()), ("x-forwarded-for", ip)];
        assert_eq!(get(addr, "/whoami", &h).await.text(), format!("ip:{ip}"));
        // The second request spends the address's second slot, the third is refused.
        assert_eq!(statuses(addr, "/whoami", &h, 2).await, [200, 429]);
    }
    // The victim's bucket is untouched: two requests left.
    let victim = format!(
        "Bearer {}",
        hs(json!({"sub": "victim", "exp": now() + 600}))
    );
    assert_eq!(
        statuses(addr, "/whoami", &[("authorization", &victim)], 3).await,
        [200, 200, 429]
    );
}

#[tokio::test]
async fn expired_future_malformed_and_unsigned_tokens_fall_back_to_the_ip() {
    let addr = app(IdentitySource::jwt(
        "sub",
        JwtVerifier::hs256(SECRET).unwrap(),
    ))
    .await;
    let expired = hs(json!({"sub": "alice", "exp": now() - 5}));
    let not_yet = hs(json!({"sub": "alice", "exp": now() + 600, "nbf": now() + 300}));
    let no_exp = hs(json!({"sub": "alice"}));
    // `alg: none`, the claim readable but unsigned.
    let unsigned = format!(
        "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{}.",
        "eyJzdWIiOiJhbGljZSIsImV4cCI6OTk5OTk5OTk5OX0"
    );
    for (i, token) in [expired, not_yet, no_exp, unsigned, "not.a.jwt".into()]
        .iter()
        .enumerate()
    {
        let ip = format!("198.51.100.{}", i + 1);
        let bearer = format!("Bearer {token}");
        let h = [("authorization", bearer.as_str()), ("x-forwarded-for", &ip)];
        assert_eq!(get(addr, "/whoami", &h).await.text(), format!("ip:{ip}"));
    }
    // Alice's claim was never charged.
    let alice = format!("Bearer {}", hs(json!({"sub": "alice", "exp": now() + 600})));
    assert_eq!(
        statuses(addr, "/whoami", &[("authorization", &alice)], 3).await,
        [200, 200, 429]
    );
}

#[tokio::test]
async fn es256_and_rs256_tokens_are_limited_on_their_claim() {
    for (alg, private, verifier) in [
        (
            JwtAlg::ES256,
            EncodingKey::from_ec_pem(ES_PRIVATE).unwrap(),
            JwtVerifier::es256_pem(ES_PUBLIC).unwrap(),
        ),
        (
            JwtAlg::RS256,
            EncodingKey::from_rsa_pem(RS_PRIVATE).unwrap(),
            JwtVerifier::rs256_pem(RS_PUBLIC).unwrap(),
        ),
    ] {
        let addr = app(IdentitySource::jwt("tenant", verifier)).await;
        let token = sign(alg, &private, json!({"tenant": 42, "exp": now() + 600}));
        let bearer = format!("Bearer {token}");
        let h = [("authorization", bearer.as_str())];
        assert_eq!(get(addr, "/whoami", &h).await.text(), "jwt-tenant:42");
        assert_eq!(
            statuses(addr, "/whoami", &h, 2).await,
            [200, 429],
            "{alg:?}"
        );
        // An HS256 token signed with the public key as the secret is not accepted.
        let confused = sign(
            JwtAlg::HS256,
            &EncodingKey::from_secret(if alg == JwtAlg::ES256 {
                ES_PUBLIC
            } else {
                RS_PUBLIC
            })
            .unwrap(),
            json!({"tenant": 7, "exp": now() + 600}),
        );
        let bearer = format!("Bearer {confused}");
        let h = [("authorization", bearer.as_str())];
        assert_eq!(get(addr, "/whoami", &h).await.text(), "ip:127.0.0.1");
    }
}

#[test]
fn short_hs256_secrets_and_foreign_keys_are_refused() {
    assert!(JwtVerifier::hs256(b"short").is_err());
    assert!(JwtVerifier::es256_pem(b"not a pem").is_err());
    assert!(JwtVerifier::rs256_pem(ES_PRIVATE).is_err());
}

#[tokio::test]
async fn cookies_are_hashed_and_limited_per_value() {
    let addr = app(IdentitySource::Cookie("session".into())).await;
    let a = [("cookie", "theme=dark; session=abc123")];
    let id = get(addr, "/whoami", &a).await.text().to_string();
    assert!(id.starts_with("cookie:h") && !id.contains("abc123"), "{id}");
    assert_eq!(statuses(addr, "/whoami", &a, 2).await, [200, 429]);
    // Another session (quoted, on a second Cookie line) has a bucket of its own.
    let b = [("cookie", "theme=dark"), ("cookie", "session=\"xyz789\"")];
    assert_eq!(statuses(addr, "/whoami", &b, 3).await, [200, 200, 429]);
    // No session cookie: the client IP.
    let none = [("cookie", "theme=dark; sessionx=abc123")];
    assert_eq!(get(addr, "/whoami", &none).await.text(), "ip:127.0.0.1");
}

#[tokio::test]
async fn query_parameters_are_limited_per_value() {
    let addr = app(IdentitySource::Query("tenant".into())).await;
    let r = get(addr, "/whoami?x=1&tenant=acme%20corp", &[]).await;
    assert_eq!(r.text(), "qry:acme corp");
    // `+` is the same space.
    assert_eq!(
        statuses(addr, "/whoami?tenant=acme+corp", &[], 2).await,
        [200, 429]
    );
    assert_eq!(
        statuses(addr, "/whoami?tenant=globex", &[], 3).await,
        [200, 200, 429]
    );
    // A value that is not printable is hashed.
    let r = get(addr, "/whoami?tenant=%00%ff", &[]).await;
    assert!(r.text().starts_with("qry-hash:h"), "{}", r.text());
    assert_eq!(
        get(addr, "/whoami?other=1", &[]).await.text(),
        "ip:127.0.0.1"
    );
}

#[tokio::test]
async fn composites_limit_per_pair_and_fall_back_when_a_part_is_missing() {
    let addr = app(IdentitySource::Composite(vec![
        IdentitySource::ClientIp,
        IdentitySource::header("x-tenant"),
    ]))
    .await;
    let pair =
        |ip: &'static str, tenant: &'static str| [("x-forwarded-for", ip), ("x-tenant", tenant)];
    let id = get(addr, "/whoami", &pair("203.0.113.9", "acme")).await;
    assert_eq!(id.text(), "cmp:14:ip:203.0.113.9;8:hdr:acme;");
    assert_eq!(
        statuses(addr, "/whoami", &pair("203.0.113.9", "acme"), 2).await,
        [200, 429]
    );
    // Same address, other tenant; same tenant, other address: each a bucket of its own.
    for (ip, tenant) in [("203.0.113.9", "globex"), ("203.0.113.10", "acme")] {
        assert_eq!(
            statuses(addr, "/whoami", &pair(ip, tenant), 3).await,
            [200, 200, 429]
        );
    }
    // A missing tenant: the whole composite falls back to the client IP.
    let h = [("x-forwarded-for", "203.0.113.9")];
    assert_eq!(get(addr, "/whoami", &h).await.text(), "ip:203.0.113.9");
}

#[test]
fn different_composites_never_spell_the_same_identity() {
    use sluice::Identity;
    use sluice_http::identity::request::composite_identity;
    let key = [7u8; 32];
    let c = |parts: &[&str]| {
        let ids: Vec<Identity> = parts.iter().map(|p| Identity::new(*p)).collect();
        composite_identity(&ids, &key)
    };
    // Separators and digits inside parts cannot move a boundary.
    let cases = [
        c(&["a;1:b", "c"]),
        c(&["a", "1:b;c"]),
        c(&["a;1:b;c"]),
        c(&["a", "", "b"]),
        c(&["a", "b"]),
        c(&["a;", "b"]),
        c(&["2:a;", "b"]),
    ];
    for (i, x) in cases.iter().enumerate() {
        for y in &cases[i + 1..] {
            assert_ne!(x, y);
        }
    }
    // Over 512 bytes the composite is hashed, still distinct per input.
    let long = "x".repeat(600);
    let h1 = c(&[&long, "a"]);
    let h2 = c(&[&long, "b"]);
    assert!(h1.as_str().starts_with("cmp-hash:h"));
    assert_ne!(h1, h2);
}
