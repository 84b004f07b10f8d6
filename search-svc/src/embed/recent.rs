//! The embeddings of recent query texts, per tenant. An agent asks the same
//! thing again across turns, and one request embeds its query twice when
//! the gateway's semantic cache looks first (its `Embed` call, then the
//! dense search's); the embedding of a text does not change when the
//! tenant writes, so unlike an answer it stays valid. Keyed by tenant and
//! text, so one tenant cannot learn from a fast answer what another asked
//! (the model would give both the same vector). Weighed in bytes; a
//! tenant flooding unique texts only evicts entries, it never slows a
//! lookup. A leaf: no service types.

use std::sync::Arc;

/// The cache; `None` capacity means off.
#[derive(Clone)]
pub struct RecentQueries {
    cache: moka::sync::Cache<(String, String), Arc<[f32]>>,
}

impl std::fmt::Debug for RecentQueries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecentQueries")
            .field("entries", &self.cache.entry_count())
            .finish()
    }
}

impl RecentQueries {
    /// At most `max_bytes` of keys and vectors; `None` for 0 (off).
    pub fn new(max_bytes: u64) -> Option<Self> {
        (max_bytes > 0).then(|| Self {
            cache: moka::sync::Cache::builder()
                .max_capacity(max_bytes)
                .weigher(|k: &(String, String), v: &Arc<[f32]>| weight(&k.0, &k.1, v))
                .build(),
        })
    }

    pub fn get(&self, tenant: &str, text: &str) -> Option<Vec<f32>> {
        let key = (tenant.to_string(), text.to_string());
        self.cache.get(&key).map(|v| v.to_vec())
    }

    pub fn insert(&self, tenant: &str, text: &str, vector: &[f32]) {
        let key = (tenant.to_string(), text.to_string());
        self.cache.insert(key, Arc::from(vector));
    }

    #[cfg(test)]
    fn settle(&self) {
        self.cache.run_pending_tasks();
    }
}

/// Bytes an entry holds (moka weights are u32).
fn weight(tenant: &str, text: &str, v: &[f32]) -> u32 {
    let bytes = tenant.len() + text.len() + std::mem::size_of_val(v) + 64;
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_is_remembered_per_tenant() {
        let r = RecentQueries::new(1 << 20).expect("on");
        r.insert("a", "where is the key?", &[1.0, 2.0]);
        assert_eq!(r.get("a", "where is the key?"), Some(vec![1.0, 2.0]));
        assert_eq!(r.get("b", "where is the key?"), None, "another tenant");
        assert_eq!(r.get("a", "where is the car?"), None, "another text");
    }

    #[test]
    fn zero_bytes_is_off_and_the_bytes_bound_the_entries() {
        assert!(RecentQueries::new(0).is_none());
        let vector = vec![0.5f32; 384];
        let one = u64::from(weight("t", "q 000", &vector));
        let r = RecentQueries::new(one * 10).expect("on");
        for i in 0..100 {
            r.insert("t", &format!("q {i:03}"), &vector);
        }
        r.settle();
        let kept = (0..100)
            .filter(|i| r.get("t", &format!("q {i:03}")).is_some())
            .count();
        assert!(kept <= 10, "{kept} kept");
    }
}
