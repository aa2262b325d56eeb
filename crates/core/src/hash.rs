//! Content hashes of JSON values, independent of key order: what sync compares to skip an
//! unchanged object, and what names a rollout's versions and Jobs. Below `sync/` and `plan/`,
//! so both use it without `plan/` depending on `sync/`.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// A hash of a JSON value that does not depend on key order.
pub fn content_hash(value: &Value) -> String {
    let mut hasher = Sha256::new();
    feed(&mut hasher, value);
    let digest = hasher.finalize();
    digest.iter().take(12).map(|b| format!("{b:02x}")).collect()
}

fn feed(h: &mut Sha256, value: &Value) {
    match value {
        Value::Null => h.update(b"n"),
        Value::Bool(b) => h.update(if *b { b"t" } else { b"f" }),
        Value::Number(n) => {
            h.update(b"#");
            h.update(n.to_string().as_bytes());
        }
        Value::String(s) => {
            h.update(b"s");
            h.update((s.len() as u64).to_le_bytes());
            h.update(s.as_bytes());
        }
        Value::Array(items) => {
            h.update(b"[");
            h.update((items.len() as u64).to_le_bytes());
            for item in items {
                feed(h, item);
            }
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            h.update(b"{");
            h.update((keys.len() as u64).to_le_bytes());
            for k in keys {
                h.update((k.len() as u64).to_le_bytes());
                h.update(k.as_bytes());
                feed(h, &map[k]);
            }
        }
    }
}

/// The shard (of `count`) that runs rollout `namespace/name`: the first 8 bytes of the
/// SHA-256 of `namespace/name`, modulo `count`. Stable across releases and machines, so every
/// replica agrees, and a restart moves nothing.
pub fn shard_of(namespace: &str, name: &str, count: u32) -> u32 {
    if count <= 1 {
        return 0;
    }
    let digest = Sha256::new()
        .chain_update(namespace.as_bytes())
        .chain_update(b"/")
        .chain_update(name.as_bytes())
        .finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) % u64::from(count)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn shard_of_is_stable_and_spreads_rollouts() {
        // Fixed values: a change here would move every sharded rollout on upgrade.
        assert_eq!(shard_of("prod", "redis", 1), 0);
        let fixed: Vec<u32> = (0..6)
            .map(|i| shard_of("prod", &format!("app-{i}"), 3))
            .collect();
        assert_eq!(fixed, [0, 2, 1, 2, 2, 0]);
        let mut per_shard = [0usize; 3];
        for i in 0..3000 {
            per_shard[shard_of("bench", &format!("app-{i:05}"), 3) as usize] += 1;
        }
        assert!(
            per_shard.iter().all(|n| (900..1100).contains(n)),
            "{per_shard:?}"
        );
    }

    #[test]
    fn content_hash_distinguishes_types() {
        assert_ne!(content_hash(&json!("1")), content_hash(&json!(1)));
        assert_ne!(
            content_hash(&json!(["ab"])),
            content_hash(&json!(["a", "b"]))
        );
    }
}
