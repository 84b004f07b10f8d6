//! An answer's receipt: the query id itself says, signed, to whom an answer
//! was given and which memories it returned, so every gateway replica can
//! check feedback on it (issue 48, check 2). Before, the record of served
//! answers lived only in the process that answered: feedback sent to
//! another replica, naming a memory the answer never returned, was
//! accepted there unchecked, and the guard was only as good as the load
//! balancer's luck. A receipt needs no shared store and no write per
//! answer, and it outlives restarts.
//!
//! Format: `<answer uuid>~<base64url(tags ‖ mac)>`, where each returned
//! memory has a 3-byte tag (keyed, so no one can make an id whose tag
//! matches another's) and the 16-byte mac covers the answer id, the tags
//! and the asking caller (tenant, agent, trust). A caller's feedback is
//! checked against its own identity: a receipt given to another caller, or
//! altered, does not verify. The key is derived from the internal service
//! token, which every replica of a deployment shares; without one, a
//! per-process key (single-process setups).
//!
//! What stays per replica: the Stage 4 features of the answer (the ranker's
//! training examples) are too large for an id, so only the replica that
//! answered makes examples of feedback on it.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use engram_common::Identity;
use hmac::Mac;
use sha2::Sha256;

type Hmac = hmac::Hmac<Sha256>;

const SEP: char = '~';
const TAG: usize = 3;
const MAC: usize = 16;
/// Longest query id a Feedback may carry: a receipt of `MAX_LIMIT` (100)
/// records is 36 + 1 + 422 characters.
pub const MAX_QUERY_ID_CHARS: usize = 1024;

/// The gateway's receipt key (same on every replica of a deployment).
#[derive(Clone)]
pub struct ReceiptKey([u8; 32]);

impl std::fmt::Debug for ReceiptKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReceiptKey(..)")
    }
}

/// What a Feedback's query id turned out to be.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// A plain id (an older gateway's, or made up): nothing to check.
    Plain,
    /// A receipt that does not verify for this caller: given to another
    /// caller, or altered.
    Foreign,
    /// A receipt of this caller's answer.
    Valid(Receipt),
}

/// The memories an answer returned, as tags.
#[derive(Debug, PartialEq, Eq)]
pub struct Receipt {
    tags: Vec<[u8; TAG]>,
}

impl Receipt {
    /// How many records the answer had (the k of precision@k).
    pub fn k(&self) -> usize {
        self.tags.len()
    }
}

/// The answer id of a query id: the part before the receipt (the whole id
/// when it is plain). What search-svc stores and the local record is
/// keyed by.
pub fn answer_id(query_id: &str) -> &str {
    query_id.split_once(SEP).map_or(query_id, |(id, _)| id)
}

impl ReceiptKey {
    /// From the deployment's shared secret, or a random key for this
    /// process when there is none.
    pub fn new(secret_opt: Option<&str>) -> Self {
        let secret: Vec<u8> = match secret_opt.filter(|s| !s.is_empty()) {
            Some(s) => s.as_bytes().to_vec(),
            None => uuid::Uuid::new_v4().as_bytes().repeat(2),
        };
        let mut key = [0u8; 32];
        if let Ok(mut mac) = Hmac::new_from_slice(&secret) {
            mac.update(b"engram answer receipt v1");
            key.copy_from_slice(&mac.finalize().into_bytes());
        }
        Self(key)
    }

    fn mac(&self) -> Hmac {
        // HMAC takes a key of any length: this never fails.
        Hmac::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!("HMAC takes any key"))
    }

    fn tag(&self, memory_id: &str) -> [u8; TAG] {
        let mut mac = self.mac();
        mac.update(b"tag\0");
        mac.update(memory_id.as_bytes());
        let full = mac.finalize().into_bytes();
        [full[0], full[1], full[2]]
    }

    /// The MAC over an answer, its caller and its tags, not yet finalised.
    fn sealer(&self, answer: &str, identity: &Identity, tags: &[u8]) -> Hmac {
        let mut mac = self.mac();
        for part in [
            answer.as_bytes(),
            identity.tenant.as_bytes(),
            identity.agent_id.as_bytes(),
        ] {
            mac.update(&u64::try_from(part.len()).unwrap_or(u64::MAX).to_le_bytes());
            mac.update(part);
        }
        mac.update(&identity.trust.as_i16().to_le_bytes());
        mac.update(tags);
        mac
    }

    /// The query id of an answer with id `answer` given to `identity` that
    /// returned `memory_ids`.
    pub fn issue<'a>(
        &self,
        answer: &str,
        identity: &Identity,
        memory_ids: impl IntoIterator<Item = &'a str>,
    ) -> String {
        let mut body: Vec<u8> = memory_ids.into_iter().flat_map(|id| self.tag(id)).collect();
        let seal = self.sealer(answer, identity, &body).finalize().into_bytes();
        body.extend_from_slice(&seal[..MAC]);
        format!("{answer}{SEP}{}", URL_SAFE_NO_PAD.encode(body))
    }

    /// Reads `query_id` as `identity`'s.
    pub fn open(&self, query_id: &str, identity: &Identity) -> Opened {
        let Some((answer, encoded)) = query_id.split_once(SEP) else {
            return Opened::Plain;
        };
        let Ok(body) = URL_SAFE_NO_PAD.decode(encoded) else {
            return Opened::Foreign;
        };
        if body.len() < MAC || !(body.len() - MAC).is_multiple_of(TAG) {
            return Opened::Foreign;
        }
        let (tags, seal) = body.split_at(body.len() - MAC);
        // verify_truncated_left compares in constant time.
        let sealer = self.sealer(answer, identity, tags);
        if sealer.verify_truncated_left(seal).is_err() {
            return Opened::Foreign;
        }
        let tags = tags.chunks_exact(TAG).map(|c| [c[0], c[1], c[2]]).collect();
        Opened::Valid(Receipt { tags })
    }

    /// Whether `receipt`'s answer returned `memory_id`.
    pub fn returned(&self, receipt: &Receipt, memory_id: &str) -> bool {
        let t = self.tag(memory_id);
        receipt.tags.contains(&t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engram_common::AccessLevel;

    fn who(tenant: &str, agent: &str, trust: AccessLevel) -> Identity {
        Identity {
            tenant: tenant.into(),
            agent_id: agent.into(),
            trust,
        }
    }

    #[test]
    fn a_receipt_names_what_its_answer_returned_on_any_replica() {
        let (a, b) = (
            ReceiptKey::new(Some("shared secret")),
            ReceiptKey::new(Some("shared secret")),
        );
        let me = who("t", "agent", AccessLevel::Internal);
        let ids = ["m-1", "m-2", "m-3"];
        let q = a.issue("ans-1", &me, ids);
        assert_eq!(answer_id(&q), "ans-1");
        let Opened::Valid(r) = b.open(&q, &me) else {
            panic!("{q} does not verify on another replica");
        };
        assert_eq!(r.k(), 3);
        assert!(ids.iter().all(|id| b.returned(&r, id)));
        assert!(!b.returned(&r, "m-4"));
    }

    #[test]
    fn another_caller_or_an_altered_receipt_does_not_verify() {
        let k = ReceiptKey::new(Some("shared secret"));
        let me = who("t", "agent", AccessLevel::Sensitive);
        let q = k.issue("ans-1", &me, ["m-1"]);
        for other in [
            who("t2", "agent", AccessLevel::Sensitive),
            who("t", "agent-2", AccessLevel::Sensitive),
            who("t", "agent", AccessLevel::Public),
        ] {
            assert_eq!(k.open(&q, &other), Opened::Foreign, "{other:?}");
        }
        // Another answer id, a dropped tag, a foreign key.
        let (_, body) = q.split_once(SEP).expect("a receipt");
        assert_eq!(k.open(&format!("ans-2~{body}"), &me), Opened::Foreign);
        let short = &body[..body.len() - 4];
        assert_eq!(k.open(&format!("ans-1~{short}"), &me), Opened::Foreign);
        let other_key = ReceiptKey::new(Some("another secret"));
        assert_eq!(other_key.open(&q, &me), Opened::Foreign);
        assert_eq!(k.open("ans-1~!!", &me), Opened::Foreign);
        assert_eq!(
            k.open("9b1deb4d-3b7d-4bad-9bdd-2b0d7b3dcb6d", &me),
            Opened::Plain
        );
    }

    #[test]
    fn a_full_answer_fits_the_query_id_limit() {
        let k = ReceiptKey::new(None);
        let me = who("t", "a", AccessLevel::Public);
        let ids: Vec<String> = (0..crate::query::MAX_LIMIT)
            .map(|_| uuid::Uuid::new_v4().to_string())
            .collect();
        let answer = uuid::Uuid::new_v4().to_string();
        let q = k.issue(&answer, &me, ids.iter().map(String::as_str));
        assert!(q.len() <= MAX_QUERY_ID_CHARS, "{}", q.len());
    }
}
