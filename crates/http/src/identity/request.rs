//! Identities read from the request line and cookies, and identities made of several parts.
//!
//! Each reader finds one value and turns it into an identity whose prefix names where it came
//! from, so a value from one place can never spell the identity of another place:
//!
//! - a cookie (`cookie:NAME`) is **always** hashed (`cookie:h<hex>`): cookies that are worth
//!   limiting on are session cookies, and a session cookie is a credential;
//! - a query parameter (`query:NAME`) is treated like a header: printable ASCII up to
//!   [`MAX_IDENTITY_LEN`] bytes stays readable (`qry:<value>`), anything else is a keyed hash
//!   (`qry-hash:h<hex>`). A query parameter that carries a secret (`?api_key=`) belongs in a
//!   header; where it cannot move, hash it with a custom source;
//! - a composite joins its parts' identities, each prefixed with its length, so the join is
//!   unambiguous: no two different lists of parts produce the same text.

use http::HeaderMap;
use sluice::Identity;
use sluice::core::key::MAX_IDENTITY_LEN;

/// `<prefix>:<value>` for printable ASCII (and tab) up to [`MAX_IDENTITY_LEN`] bytes, else the
/// keyed hash `<prefix>-hash:h<hex>` of the raw bytes. `None` for an empty value.
pub fn plain_or_hashed(prefix: &str, value: &[u8], hash_key: &[u8; 32]) -> Option<Identity> {
    if value.is_empty() {
        return None;
    }
    let plain =
        value.len() <= MAX_IDENTITY_LEN && value.iter().all(|b| matches!(b, b'\t' | 0x20..=0x7e));
    Some(match std::str::from_utf8(value) {
        Ok(text) if plain => Identity::new(format!("{prefix}:{text}")),
        _ => Identity::credential(&format!("{prefix}-hash"), value, hash_key),
    })
}

/// The value of the first cookie called `name` in the `Cookie` header lines (RFC 6265
/// `name=value` pairs separated by `;`, the value optionally in double quotes).
pub fn cookie_value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    for line in headers.get_all(http::header::COOKIE) {
        for pair in line.as_bytes().split(|b| *b == b';') {
            let pair = pair.trim_ascii();
            let Some(eq) = pair.iter().position(|b| *b == b'=') else {
                continue;
            };
            if pair[..eq].trim_ascii() != name.as_bytes() {
                continue;
            }
            let value = pair[eq + 1..].trim_ascii();
            let value = value
                .strip_prefix(b"\"")
                .and_then(|v| v.strip_suffix(b"\""))
                .unwrap_or(value);
            return Some(value);
        }
    }
    None
}

/// The identity of a cookie's value: `cookie:h<hex>`, always a keyed hash. `None` for an
/// empty value.
pub fn cookie_identity(value: &[u8], hash_key: &[u8; 32]) -> Option<Identity> {
    (!value.is_empty()).then(|| Identity::credential("cookie", value, hash_key))
}

/// The decoded value of the first query parameter called `name` (`+` is a space and
/// `%XX` a byte, in both the name and the value; a malformed `%` stays as is).
pub fn query_value(query: Option<&str>, name: &str) -> Option<Vec<u8>> {
    for pair in query?.split('&') {
        let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
        if percent_decode(n) == name.as_bytes() {
            return Some(percent_decode(v));
        }
    }
    None
}

/// The identity of a query parameter's value: `qry:<value>` or `qry-hash:h<hex>`.
pub fn query_identity(value: &[u8], hash_key: &[u8; 32]) -> Option<Identity> {
    plain_or_hashed("qry", value, hash_key)
}

fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let escaped = (b[i] == b'%')
            .then(|| hex(b.get(i + 1)).zip(hex(b.get(i + 2))))
            .flatten();
        match (b[i], escaped) {
            (_, Some((hi, lo))) => {
                out.push((hi << 4) | lo);
                i += 2;
            }
            (b'+', None) => out.push(b' '),
            (c, None) => out.push(c),
        }
        i += 1;
    }
    out
}

fn hex(c: Option<&u8>) -> Option<u8> {
    match *c? {
        c @ b'0'..=b'9' => Some(c - b'0'),
        c @ b'a'..=b'f' => Some(c - b'a' + 10),
        c @ b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// The identity made of `parts`, in order: `cmp:` then each part as `<byte length>:<text>`
/// followed by `;`. Length prefixes make the text unambiguous (a part containing `;` or
/// digits cannot shift a boundary), and the `cmp:` prefix is used by no other source. A
/// result over [`MAX_IDENTITY_LEN`] bytes is replaced by its keyed hash, `cmp-hash:h<hex>`.
pub fn composite_identity(parts: &[Identity], hash_key: &[u8; 32]) -> Identity {
    let mut s = String::from("cmp:");
    for p in parts {
        s.push_str(&p.as_str().len().to_string());
        s.push(':');
        s.push_str(p.as_str());
        s.push(';');
    }
    if s.len() <= MAX_IDENTITY_LEN {
        Identity::new(s)
    } else {
        Identity::credential("cmp-hash", s.as_bytes(), hash_key)
    }
}
