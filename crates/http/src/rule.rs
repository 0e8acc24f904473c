//! [`Rule`]: which policies apply to which requests, by path prefix and method.
//!
//! The tower layer picks its rule per request and the reverse proxy of `sluice serve` picks
//! its route the same way, with the same matcher, so a path is limited identically whether
//! an app links the layer or sits behind the proxy. Both match the normalized path
//! ([`crate::path`]), never the raw one.

use std::cmp::Ordering;
use std::sync::Arc;

use http::Method;
use sluice::Policy;

use crate::count::Count;

/// Which policies apply to the requests under a path prefix (and optionally some methods).
#[derive(Debug, Clone)]
pub struct Rule {
    pub(crate) prefix: String,
    pub(crate) methods: Vec<Method>,
    pub(crate) policies: Vec<Arc<Policy>>,
    pub(crate) cost: u64,
    pub(crate) count: Count,
    pub(crate) case_insensitive: bool,
}

impl Rule {
    /// A rule for every path under `prefix` (segment-wise: `/api` covers `/api` and
    /// `/api/x`, not `/apix`), in its normalized form ([`crate::path`]). `/` covers
    /// everything.
    pub fn new(prefix: impl Into<String>) -> Self {
        let mut prefix = prefix.into();
        if !prefix.starts_with('/') {
            prefix.insert(0, '/');
        }
        // Requests are matched by their normalized path; a prefix spelt otherwise (`//api`,
        // `/%61pi`) means the same path. One with no normal form (`/a%2Fb`) never matches.
        if let Ok(std::borrow::Cow::Owned(normal)) = crate::path::normalize(&prefix) {
            prefix = normal;
        }
        Self {
            prefix,
            methods: Vec::new(),
            policies: Vec::new(),
            cost: 1,
            count: Count::All,
            case_insensitive: false,
        }
    }
    /// Only these methods (default: any). For the same prefix, a rule naming the method wins
    /// over one that does not.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }
    /// Adds a policy. A rule without policies exempts its prefix (e.g. `/health`).
    pub fn policy(mut self, policy: impl Into<Arc<Policy>>) -> Self {
        self.policies.push(policy.into());
        self
    }
    /// The cost of one request (default 1).
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// Which responses the cost is charged for (default [`Count::All`]: every request,
    /// consumed at the check). Any other choice reserves the cost at the check too and refunds
    /// it once the response status turns out not to be counted; see [`crate::count`].
    pub fn count(mut self, count: Count) -> Self {
        self.count = count;
        self
    }

    /// Match the prefix without regard to ASCII case (default: exact). For upstreams that
    /// route case-insensitively (Express by default, ASP.NET, IIS): there `/LOGIN` reaches the
    /// `/login` handler, so it must count against the `/login` limit too.
    pub fn case_insensitive(mut self, yes: bool) -> Self {
        self.case_insensitive = yes;
        self
    }

    /// The path prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The policies, checked together (all or nothing).
    pub fn policies(&self) -> &[Arc<Policy>] {
        &self.policies
    }

    /// True when the rule covers a request with this method and path.
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        (self.methods.is_empty() || self.methods.contains(method))
            && if self.case_insensitive {
                prefix_matches_ignoring_case(&self.prefix, path)
            } else {
                prefix_matches(&self.prefix, path)
            }
    }

    /// The order in which rules are tried, so the first match is the one that applies:
    /// longest prefix first; for equal prefixes, rules naming methods first.
    pub fn precedence(&self, other: &Rule) -> Ordering {
        other
            .prefix
            .len()
            .cmp(&self.prefix.len())
            .then(self.methods.is_empty().cmp(&other.methods.is_empty()))
    }
}

/// True when `prefix` covers `path`, segment-wise: `/api` covers `/api` and `/api/x`, not
/// `/apix`; a prefix ending in `/` covers everything below it; `/` covers everything.
pub fn prefix_matches(prefix: &str, path: &str) -> bool {
    prefix == "/"
        || path == prefix
        || (path.starts_with(prefix)
            && (prefix.ends_with('/') || path.as_bytes().get(prefix.len()) == Some(&b'/')))
}

/// [`prefix_matches`] without regard to ASCII case.
pub fn prefix_matches_ignoring_case(prefix: &str, path: &str) -> bool {
    let (p, q) = (prefix.as_bytes(), path.as_bytes());
    prefix == "/"
        || (q.len() >= p.len()
            && q[..p.len()].eq_ignore_ascii_case(p)
            && (q.len() == p.len() || prefix.ends_with('/') || q[p.len()] == b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_by_segment() {
        assert!(prefix_matches("/", "/anything"));
        assert!(prefix_matches("/api", "/api"));
        assert!(prefix_matches("/api", "/api/x"));
        assert!(!prefix_matches("/api", "/apix"));
        assert!(prefix_matches("/api/", "/api/x"));
        assert!(!prefix_matches("/api/x", "/api"));
        assert!(!prefix_matches("/login", "/LOGIN"));
    }

    #[test]
    fn case_insensitive_rules_ignore_ascii_case_only() {
        let r = Rule::new("/login").case_insensitive(true);
        for p in ["/login", "/LOGIN", "/Login", "/lOgIn/x"] {
            assert!(r.matches(&Method::POST, p), "{p}");
        }
        assert!(!r.matches(&Method::POST, "/loginx"));
        assert!(!r.matches(&Method::POST, "/logi"));
        assert!(!Rule::new("/login").matches(&Method::POST, "/Login"));
    }

    #[test]
    fn longer_prefixes_and_named_methods_come_first() {
        let mut rules = [
            Rule::new("/"),
            Rule::new("/api"),
            Rule::new("/api").methods([Method::POST]),
            Rule::new("api//upload"),
        ];
        rules.sort_by(Rule::precedence);
        let order: Vec<(&str, usize)> = rules
            .iter()
            .map(|r| (r.prefix(), r.methods.len()))
            .collect();
        assert_eq!(
            order,
            [("/api/upload", 0), ("/api", 1), ("/api", 0), ("/", 0)]
        );
        assert!(rules[1].matches(&Method::POST, "/api/x"));
        assert!(!rules[1].matches(&Method::GET, "/api/x"));
    }
}
