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
    jwt_opt: Option<JwtRules>,
}

/// What a JWT must satisfy besides its HS256 signature and `exp`.
struct JwtRules {
    secret: Vec<u8>,
    audience_opt: Option<String>,
    issuer_opt: Option<String>,
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
        let jwt_opt = settings
            .jwt_hs256_secret_opt
            .as_ref()
            .filter(|s| !s.is_empty())
            .map(|s| JwtRules {
                secret: s.as_bytes().to_vec(),
                audience_opt: settings.jwt_audience_opt.clone(),
                issuer_opt: settings.jwt_issuer_opt.clone(),
            });
        Self { keys, jwt_opt }
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
            (Some(token), _) if token.split('.').count() == 3 && self.jwt_opt.is_some() => {
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
        let rules = self
            .jwt_opt
            .as_ref()
            .ok_or(Error::Unauthenticated("jwt not enabled"))?;
        let claims = verify_hs256(token, &rules.secret, chrono::Utc::now().timestamp())?;
        check_audience_and_issuer(&claims, rules)?;
        identity_of(&claims)
    }
}

const BAD_JWT: Error = Error::Unauthenticated("invalid jwt");

/// The claims of a token whose signature, `exp` and `nbf` hold at `now`.
fn verify_hs256(token: &str, secret: &[u8], now: i64) -> Result<serde_json::Value, Error> {
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
    if let Some(nbf) = claims.get("nbf") {
        let nbf = nbf
            .as_i64()
            .or_else(|| nbf.as_f64().map(|f| f as i64))
            .ok_or(BAD_JWT)?;
        if nbf > now {
            return Err(Error::Unauthenticated("jwt not yet valid"));
        }
    }
    Ok(claims)
}

fn check_audience_and_issuer(claims: &serde_json::Value, rules: &JwtRules) -> Result<(), Error> {
    if let Some(want) = &rules.audience_opt {
        let ok = match claims.get("aud") {
            Some(serde_json::Value::String(a)) => a == want,
            Some(serde_json::Value::Array(list)) => list.iter().any(|a| a.as_str() == Some(want)),
            _ => false,
        };
        if !ok {
            return Err(Error::Unauthenticated("jwt audience mismatch"));
        }
    }
    if let Some(want) = &rules.issuer_opt
        && claims.get("iss").and_then(|i| i.as_str()) != Some(want.as_str())
    {
        return Err(Error::Unauthenticated("jwt issuer mismatch"));
    }
    Ok(())
}

fn identity_of(claims: &serde_json::Value) -> Result<Identity, Error> {
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
    use hmac::Mac;
    // HMAC accepts keys of any length; the error exists for fixed-size MACs.
    let Ok(mut mac) = hmac::Hmac::<Sha256>::new_from_slice(key) else {
        return [0; 32];
    };
    mac.update(msg);
    mac.finalize().into_bytes().into()
}

/// Strict unpadded base64url (RFC 7515): any other character, padding, an
/// impossible length or non-zero leftover bits is a malformed token, not
/// something to guess at. base64's URL_SAFE_NO_PAD engine refuses all four.
fn b64url_decode(s: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .ok()
}

#[cfg(test)]
pub(crate) fn b64url_encode(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
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
            jwt_audience_opt: None,
            jwt_issuer_opt: None,
            ..Default::default()
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

    #[test]
    fn jwt_checks_nbf_audience_issuer_and_strict_base64() {
        let a = Authenticator::new(&AuthSettings {
            jwt_hs256_secret_opt: Some("s3cret".into()),
            jwt_audience_opt: Some("engram".into()),
            jwt_issuer_opt: Some("https://issuer.example".into()),
            ..Default::default()
        });
        let now = chrono::Utc::now().timestamp();
        let with = |extra: serde_json::Value| {
            let mut c = serde_json::json!({"tenant":"t2","sub":"bob","exp": now + 60,
                "aud":"engram","iss":"https://issuer.example"});
            for (k, v) in extra.as_object().into_iter().flatten() {
                c[k] = v.clone();
            }
            let t = make_jwt(b"s3cret", &c);
            a.authenticate(&md("authorization", &format!("Bearer {t}")))
        };
        assert!(with(serde_json::json!({})).is_ok());
        assert!(with(serde_json::json!({"aud": ["x", "engram"]})).is_ok());
        assert!(with(serde_json::json!({"nbf": now - 5})).is_ok());
        assert!(with(serde_json::json!({"nbf": now + 600})).is_err());
        assert!(with(serde_json::json!({"aud": "other"})).is_err());
        assert!(with(serde_json::json!({"iss": "https://evil.example"})).is_err());
        // Strict decoding: padding or junk after the data is refused.
        let good = make_jwt(
            b"s3cret",
            &serde_json::json!({"tenant":"t2","exp": now + 60}),
        );
        assert_eq!(b64url_decode("QUI"), Some(b"AB".to_vec()));
        assert_eq!(b64url_decode("QUI="), None);
        assert_eq!(b64url_decode("QUJ"), None, "non-zero leftover bits");
        assert_eq!(b64url_decode("Q"), None);
        let (h, rest) = good.split_once('.').expect("three parts");
        let padded = format!("{h}==.{rest}");
        assert!(
            a.authenticate(&md("authorization", &format!("Bearer {padded}")))
                .is_err()
        );
    }
}
