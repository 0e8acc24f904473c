//! Verified JWT claims as identities.
//!
//! A claim read from a token nobody checked is an identity the client chooses: anyone can
//! write `{"sub":"victim"}` into an unsigned token and spend someone else's budget, or mint
//! a fresh `sub` per request and never be limited. So a claim counts only once the token's
//! signature verifies under the configured key (HS256 with a shared secret, RS256 or ES256
//! with a public key), its `exp` lies in the future and its `nbf` (when present) in the
//! past. Any token that fails any check yields no claim at all, and the resolver falls back
//! to the client IP, never to the unverified claim.
//!
//! The algorithm is fixed by the configuration, never taken from the token header, so a
//! token claiming `alg: none` or HS256-signed-with-the-public-key is simply badly signed.

use std::fmt;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};

/// The shortest HS256 secret accepted: 32 bytes, the size of the HMAC-SHA-256 output
/// (RFC 7518 §3.2 requires a key at least that long).
pub const MIN_HS256_SECRET: usize = 32;

/// Why a verifier could not be built from its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtKeyError(pub String);

impl fmt::Display for JwtKeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for JwtKeyError {}

/// The signature algorithms a verifier accepts (exactly one per verifier).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JwtAlgorithm {
    /// HMAC-SHA-256 with a shared secret.
    Hs256,
    /// RSASSA-PKCS1-v1_5 with SHA-256 and an RSA public key.
    Rs256,
    /// ECDSA on P-256 with SHA-256.
    Es256,
}

impl std::str::FromStr for JwtAlgorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "HS256" => Ok(JwtAlgorithm::Hs256),
            "RS256" => Ok(JwtAlgorithm::Rs256),
            "ES256" => Ok(JwtAlgorithm::Es256),
            _ => Err(format!(
                "unsupported JWT algorithm {s:?}: expected HS256, RS256 or ES256"
            )),
        }
    }
}

/// Checks bearer tokens and reads one claim from those that pass.
#[derive(Clone)]
pub struct JwtVerifier {
    algorithm: JwtAlgorithm,
    key: DecodingKey,
    validation: Validation,
}

impl fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key (an HS256 key is a secret).
        f.debug_struct("JwtVerifier")
            .field("algorithm", &self.algorithm)
            .field("leeway_s", &self.validation.leeway)
            .field("audience", &self.validation.aud)
            .field("issuer", &self.validation.iss)
            .finish_non_exhaustive()
    }
}

impl JwtVerifier {
    /// HS256 with a shared secret of at least [`MIN_HS256_SECRET`] bytes.
    pub fn hs256(secret: &[u8]) -> Result<Self, JwtKeyError> {
        if secret.len() < MIN_HS256_SECRET {
            return Err(JwtKeyError(format!(
                "an HS256 secret must be at least {MIN_HS256_SECRET} bytes (got {})",
                secret.len()
            )));
        }
        let key = DecodingKey::from_secret(secret)
            .map_err(|e| JwtKeyError(format!("unusable HS256 secret: {e}")))?;
        Ok(Self::with_key(JwtAlgorithm::Hs256, key))
    }

    /// RS256 with an RSA public key in PEM (`BEGIN PUBLIC KEY` or `BEGIN RSA PUBLIC KEY`).
    pub fn rs256_pem(pem: &[u8]) -> Result<Self, JwtKeyError> {
        let key = DecodingKey::from_rsa_pem(pem)
            .map_err(|e| JwtKeyError(format!("not an RSA public key in PEM: {e}")))?;
        Ok(Self::with_key(JwtAlgorithm::Rs256, key))
    }

    /// ES256 with a P-256 public key in PEM (`BEGIN PUBLIC KEY`).
    pub fn es256_pem(pem: &[u8]) -> Result<Self, JwtKeyError> {
        let key = DecodingKey::from_ec_pem(pem)
            .map_err(|e| JwtKeyError(format!("not an EC public key in PEM: {e}")))?;
        Ok(Self::with_key(JwtAlgorithm::Es256, key))
    }

    /// A verifier for `algorithm` with `key`: a secret for HS256, a PEM public key otherwise.
    pub fn new(algorithm: JwtAlgorithm, key: &[u8]) -> Result<Self, JwtKeyError> {
        match algorithm {
            JwtAlgorithm::Hs256 => Self::hs256(key),
            JwtAlgorithm::Rs256 => Self::rs256_pem(key),
            JwtAlgorithm::Es256 => Self::es256_pem(key),
        }
    }

    fn with_key(algorithm: JwtAlgorithm, key: DecodingKey) -> Self {
        let alg = match algorithm {
            JwtAlgorithm::Hs256 => Algorithm::HS256,
            JwtAlgorithm::Rs256 => Algorithm::RS256,
            JwtAlgorithm::Es256 => Algorithm::ES256,
        };
        let mut validation = Validation::new(alg);
        // `exp` is required and checked; `nbf` is checked when present. No grace period by
        // default: an expired token is expired.
        validation.leeway = 0;
        validation.validate_nbf = true;
        // The audience is only checked when one is configured.
        validation.validate_aud = false;
        Self {
            algorithm,
            key,
            validation,
        }
    }

    /// Accepts tokens up to `seconds` past `exp` or before `nbf` (clock skew between the
    /// issuer and this host).
    pub fn leeway(mut self, seconds: u64) -> Self {
        self.validation.leeway = seconds;
        self
    }

    /// Accepts only tokens whose `aud` contains `audience`.
    pub fn audience(mut self, audience: &str) -> Self {
        self.validation.set_audience(&[audience]);
        self.validation.validate_aud = true;
        self
    }

    /// Accepts only tokens whose `iss` is `issuer`.
    pub fn issuer(mut self, issuer: &str) -> Self {
        self.validation.set_issuer(&[issuer]);
        self
    }

    /// The algorithm this verifier accepts.
    pub fn algorithm(&self) -> JwtAlgorithm {
        self.algorithm
    }

    /// The value of `claim` in `token` if, and only if, the token verifies: a string as is,
    /// a number or boolean as its JSON text. `None` for a token that is malformed, badly
    /// signed, of another algorithm, expired or not yet valid, and for a claim that is
    /// absent, null, an object or an array.
    pub fn claim(&self, token: &[u8], claim: &str) -> Option<String> {
        let token = std::str::from_utf8(token).ok()?;
        let data =
            jsonwebtoken::decode::<serde_json::Value>(token, &self.key, &self.validation).ok()?;
        match data.claims.get(claim)? {
            serde_json::Value::String(s) => Some(s.clone()),
            v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_)) => Some(v.to_string()),
            _ => None,
        }
    }
}
