//! W3C Trace Context (`traceparent`): reading the caller's, writing sluice's, and the
//! sampling decision. Pure logic, no I/O.
//!
//! `traceparent: 00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>`. A header that
//! does not parse is ignored (a new trace starts), as the specification asks: a malformed
//! header from a client must never fail a rate limit decision.

/// The `sampled` bit of the trace flags.
pub(crate) const FLAG_SAMPLED: u8 = 0x01;

/// A parsed `traceparent`: the caller's trace and span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace id (never zero).
    pub trace_id: u128,
    /// The caller's span id, the parent of sluice's span (never zero).
    pub span_id: u64,
    /// The trace flags (bit 0: sampled).
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` value; `None` when it is not valid W3C Trace Context.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        let b = s.as_bytes();
        // version "00" is exactly 55 characters; a later version may append "-..." fields.
        if b.len() < 55 || (b.len() > 55 && b[55] != b'-') {
            return None;
        }
        let version = u8::from_str_radix(hex(&s[0..2])?, 16).ok()?;
        if version == 0xff || (version == 0 && b.len() != 55) {
            return None;
        }
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let trace_id = u128::from_str_radix(hex(&s[3..35])?, 16).ok()?;
        let span_id = u64::from_str_radix(hex(&s[36..52])?, 16).ok()?;
        let flags = u8::from_str_radix(hex(&s[53..55])?, 16).ok()?;
        if trace_id == 0 || span_id == 0 {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            flags,
        })
    }

    /// Whether the caller recorded its span.
    pub fn sampled(&self) -> bool {
        self.flags & FLAG_SAMPLED != 0
    }

    /// The header value (version 00).
    pub fn header(&self) -> String {
        format!(
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id, self.span_id, self.flags
        )
    }
}

/// Lowercase hex only (the specification refuses uppercase).
fn hex(s: &str) -> Option<&str> {
    s.bytes()
        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        .then_some(s)
}

/// Whether a new trace (no caller's `traceparent`) is recorded at `ratio`: decided from the
/// trace id's low 64 bits, so every instance seeing the same trace id decides the same way.
pub fn sample_new_trace(trace_id: u128, ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 {
        return false;
    }
    let threshold = (ratio * u64::MAX as f64) as u64;
    (trace_id as u64) < threshold
}

/// A random id that is not zero (zero means "invalid" in W3C and OTLP).
pub(crate) fn nonzero_u128() -> u128 {
    loop {
        let v: u128 = rand::random();
        if v != 0 {
            return v;
        }
    }
}

/// A random span id that is not zero.
pub(crate) fn nonzero_u64() -> u64 {
    loop {
        let v: u64 = rand::random();
        if v != 0 {
            return v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_specification_example() {
        let t = TraceParent::parse(GOOD).unwrap();
        assert_eq!(t.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(t.span_id, 0x00f067aa0ba902b7);
        assert!(t.sampled());
        assert_eq!(t.header(), GOOD);
    }

    #[test]
    fn refuses_malformed_headers() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn later_versions_keep_the_known_fields() {
        let t = TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-later")
            .unwrap();
        assert!(!t.sampled());
    }

    #[test]
    fn sampling_follows_the_ratio() {
        assert!(sample_new_trace(u128::MAX, 1.0));
        assert!(!sample_new_trace(1, 0.0));
        let kept = (0..10_000u128)
            .filter(|i| {
                sample_new_trace(
                    i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835),
                    0.25,
                )
            })
            .count();
        assert!((2_000..3_000).contains(&kept), "{kept}");
    }
}
