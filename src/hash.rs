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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_hash_distinguishes_types() {
        assert_ne!(content_hash(&json!("1")), content_hash(&json!(1)));
        assert_ne!(
            content_hash(&json!(["ab"])),
            content_hash(&json!(["a", "b"]))
        );
    }
}
