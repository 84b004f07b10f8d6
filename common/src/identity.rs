//! Who is calling. The gateway authenticates the caller and forwards the
//! identity to every downstream in metadata; downstreams trust that metadata
//! only when it comes with the internal service token, so nothing inside the
//! network can skip the gateway's access control by calling them directly.

use tonic::metadata::{MetadataMap, MetadataValue};

use crate::settings::AccessLevelName;

pub const TENANT_KEY: &str = "x-engram-tenant";
pub const AGENT_KEY: &str = "x-engram-agent";
pub const TRUST_KEY: &str = "x-engram-trust";
pub const INTERNAL_TOKEN_KEY: &str = "x-engram-internal-token";
/// The id a gateway gives one write call; search-svc returns it in the
/// write's change event (`ChangeEvent.write_id`).
pub const WRITE_ID_KEY: &str = "x-engram-write-id";
/// The longest write id kept; a longer one (or one of other characters
/// than ASCII letters, digits and '-') is read as none.
const MAX_WRITE_ID: usize = 64;

/// The write id an internal call carries, or "" when it has none or a
/// malformed one: an id only spares its own gateway a second drop of
/// cached answers, so a bad one costs nothing but that.
pub fn read_write_id(md: &MetadataMap) -> String {
    let id = md
        .get(WRITE_ID_KEY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let ok = id.len() <= MAX_WRITE_ID && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ok { id.to_string() } else { String::new() }
}

/// Puts `id` on an outgoing internal call.
pub fn write_write_id(md: &mut MetadataMap, id: &str) {
    if let Ok(v) = MetadataValue::try_from(id) {
        md.insert(WRITE_ID_KEY, v);
    }
}

/// Trust levels, ordered; stored as smallint 1..=4 in Postgres.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AccessLevel {
    Public = 1,
    Internal = 2,
    Confidential = 3,
    Sensitive = 4,
}

impl AccessLevel {
    pub fn as_i16(self) -> i16 {
        self as i16
    }

    pub fn from_i16(v: i16) -> Option<Self> {
        match v {
            1 => Some(Self::Public),
            2 => Some(Self::Internal),
            3 => Some(Self::Confidential),
            4 => Some(Self::Sensitive),
            _ => None,
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        AccessLevelName::parse(s).and_then(Self::from_i16)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Public => "public",
            Self::Internal => "internal",
            Self::Confidential => "confidential",
            Self::Sensitive => "sensitive",
        }
    }

    /// From the proto enum value; unspecified (0) means public.
    pub fn from_proto(v: i32) -> Option<Self> {
        match v {
            0 => Some(Self::Public),
            1..=4 => Self::from_i16(v as i16),
            _ => None,
        }
    }

    pub fn to_proto(self) -> i32 {
        self as i32
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    pub tenant: String,
    pub agent_id: String,
    pub trust: AccessLevel,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    #[error("missing or wrong internal service token")]
    BadInternalToken,
    #[error("missing identity metadata {0}")]
    Missing(&'static str),
    #[error("invalid identity metadata {0}")]
    Invalid(&'static str),
}

impl From<IdentityError> for tonic::Status {
    fn from(e: IdentityError) -> Self {
        match e {
            IdentityError::BadInternalToken => tonic::Status::unauthenticated(e.to_string()),
            IdentityError::Missing(_) | IdentityError::Invalid(_) => {
                tonic::Status::invalid_argument(e.to_string())
            }
        }
    }
}

impl Identity {
    /// Writes the identity (and the internal token) into outgoing metadata.
    pub fn write_internal(&self, md: &mut MetadataMap, internal_token: &str) {
        for (k, v) in [
            (TENANT_KEY, self.tenant.as_str()),
            (AGENT_KEY, self.agent_id.as_str()),
            (TRUST_KEY, self.trust.name()),
            (INTERNAL_TOKEN_KEY, internal_token),
        ] {
            if let Ok(v) = MetadataValue::try_from(v) {
                md.insert(k, v);
            }
        }
    }

    /// Checks an internal call's token in constant time; for calls that
    /// act for no one tenant (the change feed). `expected_token` None = no
    /// token configured: refuse.
    pub fn check_internal_token(
        md: &MetadataMap,
        expected_token: Option<&str>,
    ) -> Result<(), IdentityError> {
        let got = md
            .get(INTERNAL_TOKEN_KEY)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        match expected_token {
            Some(t) if !t.is_empty() && constant_time_eq(t.as_bytes(), got.as_bytes()) => Ok(()),
            _ => Err(IdentityError::BadInternalToken),
        }
    }

    /// Reads the identity of an internal call, after checking the token in
    /// constant time. `expected_token` None = no token configured: refuse.
    pub fn read_internal(
        md: &MetadataMap,
        expected_token: Option<&str>,
    ) -> Result<Self, IdentityError> {
        Self::check_internal_token(md, expected_token)?;
        let get = |k: &'static str| -> Result<&str, IdentityError> {
            md.get(k)
                .ok_or(IdentityError::Missing(k))?
                .to_str()
                .map_err(|_| IdentityError::Invalid(k))
        };
        let tenant = get(TENANT_KEY)?;
        if tenant.is_empty() {
            return Err(IdentityError::Invalid(TENANT_KEY));
        }
        let trust = AccessLevel::parse(get(TRUST_KEY)?).ok_or(IdentityError::Invalid(TRUST_KEY))?;
        Ok(Self {
            tenant: tenant.to_string(),
            agent_id: get(AGENT_KEY)?.to_string(),
            trust,
        })
    }
}

pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_identity_round_trips_only_with_the_token() {
        let id = Identity {
            tenant: "t1".into(),
            agent_id: "a".into(),
            trust: AccessLevel::Confidential,
        };
        let mut md = MetadataMap::new();
        id.write_internal(&mut md, "secret");
        assert_eq!(Identity::read_internal(&md, Some("secret")), Ok(id));
        assert_eq!(
            Identity::read_internal(&md, Some("other")),
            Err(IdentityError::BadInternalToken)
        );
        assert_eq!(
            Identity::read_internal(&md, None),
            Err(IdentityError::BadInternalToken)
        );
    }

    #[test]
    fn write_ids_round_trip_and_malformed_ones_read_as_none() {
        let mut md = MetadataMap::new();
        assert_eq!(read_write_id(&md), "");
        write_write_id(&mut md, "4f1c-9a");
        assert_eq!(read_write_id(&md), "4f1c-9a");
        write_write_id(&mut md, "a b");
        assert_eq!(read_write_id(&md), "");
        write_write_id(&mut md, &"x".repeat(65));
        assert_eq!(read_write_id(&md), "");
    }

    #[test]
    fn access_levels_are_ordered() {
        assert!(AccessLevel::Public < AccessLevel::Sensitive);
        assert_eq!(AccessLevel::from_proto(0), Some(AccessLevel::Public));
        assert_eq!(AccessLevel::from_proto(9), None);
    }
}
