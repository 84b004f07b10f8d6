//! Caller identity from request metadata: API keys (stored only as sha256 in
//! config, so a leaked config file leaks no keys) or HS256 JWTs. Identity is
//! never read from the request body. HS256 is hand-rolled on `sha2` (HMAC is
//! a dozen lines) to avoid pulling a JOSE stack with crypto backends we do
//! not need.

use std::collections::HashMap;

use engram_common::identity::constant_time_eq;
use engram_common::settings::AuthSettings;
use engram_common::{AccessLevel, Identity};
use sha2::{Digest, Sha256};
use tonic::metadata::MetadataMap;

use crate::error::Error;

pub struct Authenticator {
    /// sha256 hex of the key → identity.
    keys: HashMap<String, Identity>,
    jwt_secret_opt: Option<Vec<u8>>,
}

impl Authenticator {
    pub fn new(settings: &AuthSettings) -> Self {
        let keys = settings
            .api_keys
            .iter()
            .filter_map(|k| {
                let trust = AccessLevel::parse(&k.trust)?;
                Some((
                    k.sha256.to_ascii_lowercase(),
                    Identity {
                        tenant: k.tenant.clone(),
                        agent_id: k.agent_id.clone(),
                        trust,
                    },
                ))
            })
            .collect();
        Self {
            keys,
            jwt_secret_opt: settings
                .jwt_hs256_secret_opt
                .as_ref()
                .filter(|s| !s.is_empty())
                .map(|s| s.as_bytes().to_vec()),
        }
    }

    pub fn authenticate(&self, md: &MetadataMap) -> Result<Identity, Error> {
        let bearer_opt = md
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim);
        let key_opt = md
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim);
        match (bearer_opt, key_opt) {
            (Some(token), _) if token.split('.').count() == 3 && self.jwt_secret_opt.is_some() => {
                self.jwt(token)
            }
            (Some(key), _) | (None, Some(key)) => self.api_key(key),
            (None, None) => Err(Error::Unauthenticated("missing credentials")),
        }
    }

    fn api_key(&self, key: &str) -> Result<Identity, Error> {
        if key.is_empty() {
            return Err(Error::Unauthenticated("empty api key"));
        }
        let digest = hex::encode(Sha256::digest(key.as_bytes()));
        // Constant-time over the stored digests so timing reveals nothing.
        let mut found = None;
        for (stored, id) in &self.keys {
            if constant_time_eq(stored.as_bytes(), digest.as_bytes()) {
                found = Some(id.clone());
            }
        }
        found.ok_or(Error::Unauthenticated("unknown api key"))
    }

    fn jwt(&self, token: &str) -> Result<Identity, Error> {
        let secret = self
            .jwt_secret_opt
            .as_deref()
            .ok_or(Error::Unauthenticated("jwt not enabled"))?;
        verify_hs256(token, secret, chrono::Utc::now().timestamp())
    }
}

const BAD_JWT: Error = Error::Unauthenticated("invalid jwt");

fn verify_hs256(token: &str, secret: &[u8], now: i64) -> Result<Identity, Error> {
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(BAD_JWT);
    };
    let header: serde_json::Value =
        serde_json::from_slice(&b64url_decode(h).ok_or(BAD_JWT)?).map_err(|_| BAD_JWT)?;
    if header.get("alg").and_then(|a| a.as_str()) != Some("HS256") {
        return Err(Error::Unauthenticated("jwt alg must be HS256"));
    }
    let sig = b64url_decode(s).ok_or(BAD_JWT)?;
    let expected = hmac_sha256(secret, format!("{h}.{p}").as_bytes());
    if !constant_time_eq(&sig, &expected) {
        return Err(Error::Unauthenticated("jwt signature mismatch"));
    }
    let claims: serde_json::Value =
        serde_json::from_slice(&b64url_decode(p).ok_or(BAD_JWT)?).map_err(|_| BAD_JWT)?;
    let exp = claims
        .get("exp")
        .and_then(|e| e.as_i64().or_else(|| e.as_f64().map(|f| f as i64)))
        .ok_or(Error::Unauthenticated("jwt without exp"))?;
    if exp <= now {
        return Err(Error::Unauthenticated("jwt expired"));
    }
    let tenant = claims
        .get("tenant")
        .and_then(|t| t.as_str())
        .filter(|t| !t.is_empty())
        .ok_or(Error::Unauthenticated("jwt without tenant"))?;
    let agent = claims.get("sub").and_then(|t| t.as_str()).unwrap_or("");
    let trust = match claims.get("trust") {
        Some(serde_json::Value::String(s)) => AccessLevel::parse(s),
        Some(serde_json::Value::Number(n)) => n
            .as_i64()
            .and_then(|v| i16::try_from(v).ok())
            .and_then(AccessLevel::from_i16),
        None => Some(AccessLevel::Public),
        _ => None,
    }
    .ok_or(Error::Unauthenticated("jwt trust invalid"))?;
    Ok(Identity {
        tenant: tenant.to_string(),
        agent_id: agent.to_string(),
        trust,
    })
}

pub(crate) fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut ipad = [0x36u8; 64];
    let mut opad = [0x5cu8; 64];
    for i in 0..64 {
        ipad[i] ^= k[i];
        opad[i] ^= k[i];
    }
    let inner = Sha256::new()
        .chain_update(ipad)
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(opad)
        .chain_update(inner)
        .finalize()
        .into()
}

fn b64url_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            b'=' => break,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
pub(crate) fn b64url_encode(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

#[cfg(test)]
pub(crate) fn make_jwt(secret: &[u8], claims: &serde_json::Value) -> String {
    let h = b64url_encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let p = b64url_encode(claims.to_string().as_bytes());
    let sig = hmac_sha256(secret, format!("{h}.{p}").as_bytes());
    format!("{h}.{p}.{}", b64url_encode(&sig))
}

#[cfg(test)]
mod tests {
    use super::*;
    use engram_common::settings::ApiKeySettings;

    fn auth() -> Authenticator {
        Authenticator::new(&AuthSettings {
            api_keys: vec![ApiKeySettings {
                sha256: hex::encode(Sha256::digest(b"k1")),
                tenant: "t1".into(),
                agent_id: "a1".into(),
                trust: "internal".into(),
            }],
            jwt_hs256_secret_opt: Some("s3cret".into()),
            internal_token_opt: None,
        })
    }

    fn md(k: &'static str, v: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert(k, v.parse().expect("ascii"));
        m
    }

    #[test]
    fn hmac_matches_rfc4231_case_2() {
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn api_key_from_bearer_or_header() {
        let a = auth();
        let id = a
            .authenticate(&md("authorization", "Bearer k1"))
            .expect("ok");
        assert_eq!(id.tenant, "t1");
        assert_eq!(id.trust, AccessLevel::Internal);
        assert!(a.authenticate(&md("x-api-key", "k1")).is_ok());
        assert!(matches!(
            a.authenticate(&md("x-api-key", "nope")),
            Err(Error::Unauthenticated(_))
        ));
        assert!(a.authenticate(&MetadataMap::new()).is_err());
    }

    #[test]
    fn jwt_checks_signature_and_exp() {
        let a = auth();
        let now = chrono::Utc::now().timestamp();
        let good = make_jwt(
            b"s3cret",
            &serde_json::json!({"tenant":"t2","sub":"bob","trust":"confidential","exp": now + 60}),
        );
        let id = a
            .authenticate(&md("authorization", &format!("Bearer {good}")))
            .expect("valid jwt");
        assert_eq!(
            (id.tenant.as_str(), id.agent_id.as_str(), id.trust),
            ("t2", "bob", AccessLevel::Confidential)
        );
        let expired = make_jwt(
            b"s3cret",
            &serde_json::json!({"tenant":"t2","sub":"bob","exp": now - 1}),
        );
        assert!(
            a.authenticate(&md("authorization", &format!("Bearer {expired}")))
                .is_err()
        );
        let forged = make_jwt(
            b"other",
            &serde_json::json!({"tenant":"t2","sub":"bob","exp": now + 60}),
        );
        assert!(
            a.authenticate(&md("authorization", &format!("Bearer {forged}")))
                .is_err()
        );
    }
}
