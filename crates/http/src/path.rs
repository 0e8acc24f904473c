//! Request paths as the limiter sees them: one spelling per resource.
//!
//! An upstream framework maps many spellings onto one handler: FastAPI serves `/%6cogin` as
//! `/login`, most servers merge `//login` and resolve `/./login`. A limiter that compared the
//! raw text would limit `/login` while `/%6cogin` walked past it to the same handler. So the
//! layer and the reverse proxy match rules against the path [`normalize`] returns, and the
//! proxy forwards exactly that path, so what was limited is what the upstream serves:
//!
//! - percent-encoded unreserved characters (`ALPHA DIGIT - . _ ~`, RFC 3986 §2.3) are decoded;
//!   any other percent-encoding is kept, with its hex digits in upper case;
//! - repeated slashes are merged and `.` / `..` segments resolved (never above the root);
//! - a path whose meaning differs between servers is refused rather than guessed
//!   ([`PathError`]): an encoded `/` (`%2F`) or `\` (`%5C`), a raw `\`, an encoded NUL
//!   (`%00`), a `%` not followed by two hex digits, and a `.` or `..` segment spelt with an
//!   encoded dot (`%2E`). Some servers decode these before routing and some after, so no single
//!   normalized form is the one the upstream will serve.
//!
//! Case is left alone: a route with `case_insensitive` compares without it
//! ([`crate::Rule::case_insensitive`]), for upstreams that route that way (Express, ASP.NET,
//! IIS).

use std::borrow::Cow;

/// Why a path cannot be normalized safely. The message is the `detail` of the 400 answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    /// `%2F`: servers disagree on whether it separates segments.
    EncodedSlash,
    /// `%5C` or a raw `\`: some servers treat it as `/`.
    Backslash,
    /// `%00`.
    Nul,
    /// A `%` not followed by two hex digits.
    BadPercent,
    /// A `.` or `..` segment written with `%2E`.
    EncodedDotSegment,
    /// Not an origin-form path (does not start with `/`).
    NotAbsolute,
}

impl PathError {
    /// The sentence the 400 problem+json answer carries.
    pub fn message(self) -> &'static str {
        match self {
            PathError::EncodedSlash => {
                "the request path contains an encoded slash (%2F), which servers interpret differently"
            }
            PathError::Backslash => {
                "the request path contains a backslash (raw or %5C), which servers interpret differently"
            }
            PathError::Nul => "the request path contains an encoded NUL (%00)",
            PathError::BadPercent => {
                "the request path contains a '%' that is not followed by two hex digits"
            }
            PathError::EncodedDotSegment => {
                "the request path contains a dot segment written with encoded dots (%2E)"
            }
            PathError::NotAbsolute => "the request path must start with '/'",
        }
    }
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for PathError {}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// True when the path is already in normal form, so the common request allocates nothing:
/// no `%`, no `\\`, no `.` or `..` segment, no empty segment but a trailing one.
fn is_normal(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    if rest.bytes().any(|c| c == b'%' || c == b'\\') {
        return false;
    }
    let mut segments = rest.split('/').peekable();
    while let Some(seg) = segments.next() {
        let last = segments.peek().is_none();
        if seg == "." || seg == ".." || (seg.is_empty() && !last) {
            return false;
        }
    }
    true
}

/// The normal form of `path` (the path only, no query), or why there is none. `*` (the
/// `OPTIONS *` target) is returned as is.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, PathError> {
    if is_normal(path) || path == "*" {
        return Ok(Cow::Borrowed(path));
    }
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    // Decode segment by segment, noting which segments spelt a dot with %2E.
    let mut segments: Vec<(String, bool)> = Vec::new();
    for raw in path[1..].split('/') {
        let bytes = raw.as_bytes();
        let mut seg: Vec<u8> = Vec::with_capacity(raw.len());
        let mut encoded_dot = false;
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' => return Err(PathError::Backslash),
                b'%' => {
                    let (Some(hi), Some(lo)) = (
                        bytes.get(i + 1).copied().and_then(hex),
                        bytes.get(i + 2).copied().and_then(hex),
                    ) else {
                        return Err(PathError::BadPercent);
                    };
                    match hi << 4 | lo {
                        b'/' => return Err(PathError::EncodedSlash),
                        b'\\' => return Err(PathError::Backslash),
                        0 => return Err(PathError::Nul),
                        b'.' => {
                            encoded_dot = true;
                            seg.push(b'.');
                        }
                        b if unreserved(b) => seg.push(b),
                        b => {
                            const HEX: &[u8; 16] = b"0123456789ABCDEF";
                            seg.extend([b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
                        }
                    }
                    i += 3;
                }
                c => {
                    seg.push(c);
                    i += 1;
                }
            }
        }
        // Only ASCII was decoded and every other byte copied in order, so multi-byte
        // characters stay whole.
        let seg = String::from_utf8(seg).map_err(|_| PathError::BadPercent)?;
        segments.push((seg, encoded_dot));
    }
    // Resolve dot segments (RFC 3986 §5.2.4) and merge empty ones; remember whether the path
    // ends in a directory (`/a/`, `/a/.`, `/a/..`).
    let mut out: Vec<String> = Vec::new();
    let last = segments.len() - 1;
    let mut trailing = false;
    for (i, (seg, encoded_dot)) in segments.into_iter().enumerate() {
        let dot = seg == "." || seg == "..";
        if dot && encoded_dot {
            return Err(PathError::EncodedDotSegment);
        }
        match seg.as_str() {
            "" | "." => trailing = i == last,
            ".." => {
                out.pop();
                trailing = i == last;
            }
            _ => {
                out.push(seg);
                trailing = false;
            }
        }
    }
    let mut normal = String::with_capacity(path.len());
    for seg in &out {
        normal.push('/');
        normal.push_str(seg);
    }
    if normal.is_empty() || trailing {
        normal.push('/');
    }
    Ok(Cow::Owned(normal))
}

/// The request target with its path normalized and its query kept; `None` when the path
/// already was normal (nothing to rewrite).
pub fn normalize_uri(uri: &http::Uri) -> Result<Option<http::Uri>, PathError> {
    let Cow::Owned(path) = normalize(uri.path())? else {
        return Ok(None);
    };
    let pq = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    let mut parts = uri.clone().into_parts();
    // Only unreserved characters were decoded, so the result is a valid target again.
    parts.path_and_query = Some(pq.parse().map_err(|_| PathError::BadPercent)?);
    Ok(Some(
        http::Uri::from_parts(parts).map_err(|_| PathError::BadPercent)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(p: &str) -> Result<String, PathError> {
        normalize(p).map(Cow::into_owned)
    }

    #[test]
    fn spellings_of_one_path_become_one() {
        for p in [
            "/login",
            "/%6cogin",
            "/%6Cogin",
            "//login",
            "///login",
            "/./login",
            "/x/../login",
            "/../login",
            "/%6c%6f%67%69%6e",
        ] {
            assert_eq!(n(p).unwrap(), "/login", "{p}");
        }
        assert_eq!(n("/api/").unwrap(), "/api/");
        assert_eq!(n("/api//").unwrap(), "/api/");
        assert_eq!(n("/api/.").unwrap(), "/api/");
        assert_eq!(n("/api/x/..").unwrap(), "/api/");
        assert_eq!(n("/").unwrap(), "/");
        assert_eq!(n("//").unwrap(), "/");
        assert_eq!(n("/..").unwrap(), "/");
        assert_eq!(n("/a.b/c~d_e-f").unwrap(), "/a.b/c~d_e-f");
        assert_eq!(n("/file%2Etxt").unwrap(), "/file.txt");
        assert_eq!(n("/..a/b..").unwrap(), "/..a/b..");
        assert_eq!(n("*").unwrap(), "*");
    }

    #[test]
    fn other_encodings_are_kept_in_upper_case() {
        assert_eq!(n("/a%20b").unwrap(), "/a%20b");
        assert_eq!(n("/caf%c3%a9").unwrap(), "/caf%C3%A9");
        assert_eq!(n("/a%3fb").unwrap(), "/a%3Fb");
        assert_eq!(n("/100%25").unwrap(), "/100%25");
    }

    #[test]
    fn normal_paths_are_borrowed() {
        for p in ["/", "/login", "/api/v1/x", "/api/", "/a.b/.c"] {
            assert!(matches!(normalize(p), Ok(Cow::Borrowed(_))), "{p}");
        }
    }

    #[test]
    fn ambiguous_paths_are_refused() {
        assert_eq!(n("/a%2Fb"), Err(PathError::EncodedSlash));
        assert_eq!(n("/a%2fb"), Err(PathError::EncodedSlash));
        assert_eq!(n("/a%5Cb"), Err(PathError::Backslash));
        assert_eq!(n("/a\\b"), Err(PathError::Backslash));
        assert_eq!(n("/a%00"), Err(PathError::Nul));
        assert_eq!(n("/a%"), Err(PathError::BadPercent));
        assert_eq!(n("/a%4"), Err(PathError::BadPercent));
        assert_eq!(n("/a%zz"), Err(PathError::BadPercent));
        assert_eq!(n("/%2e/login"), Err(PathError::EncodedDotSegment));
        assert_eq!(n("/x/%2e%2e/login"), Err(PathError::EncodedDotSegment));
        assert_eq!(n("/x/.%2E/login"), Err(PathError::EncodedDotSegment));
        assert_eq!(n("login"), Err(PathError::NotAbsolute));
    }

    #[test]
    fn normal_forms_are_fixed_points() {
        for p in ["/%6cogin", "//a//b/", "/a/./b/../c", "/caf%c3%a9", "/x%2Ey"] {
            let once = n(p).unwrap();
            assert_eq!(n(&once).unwrap(), once, "{p}");
        }
    }

    #[test]
    fn queries_are_kept() {
        let u: http::Uri = "/%6cogin?a=%2F&b=1".parse().unwrap();
        assert_eq!(
            normalize_uri(&u).unwrap().unwrap().to_string(),
            "/login?a=%2F&b=1"
        );
        assert_eq!(normalize_uri(&"/login?x".parse().unwrap()).unwrap(), None);
    }
}
