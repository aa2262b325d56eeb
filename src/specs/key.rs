//! The key of an object in the cluster, shared by every structure that names the object.

use std::fmt;
use std::sync::Arc;

/// Identifies an object in the cluster: group, kind, namespace and name. Its parts are
/// shared: a key is held by its file's objects, twice by the spec set's map, by the sync's
/// hashes and by the inventory, and at 10,000 rollouts four copies of four strings each
/// cost about 9 MiB (issue 51). A clone is a reference count. Compares, orders and hashes
/// by its parts, as the plain struct did.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey(Arc<ObjectKeyParts>);

/// The parts of an [`ObjectKey`], read through it (`key.name`).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKeyParts {
    /// `apiVersion` as written, e.g. `apps/v1`.
    pub api_version: String,
    pub kind: String,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    pub name: String,
}

impl std::ops::Deref for ObjectKey {
    type Target = ObjectKeyParts;

    fn deref(&self) -> &ObjectKeyParts {
        &self.0
    }
}

impl fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectKey")
            .field("api_version", &self.api_version)
            .field("kind", &self.kind)
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish()
    }
}

impl ObjectKey {
    /// Whether `other` is this very key, not an equal one built apart.
    pub fn shares_parts(&self, other: &ObjectKey) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The key of `kind` `namespace/name` (`namespace` empty for a cluster-scoped object).
    pub fn new(
        api_version: impl Into<String>,
        kind: impl Into<String>,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> ObjectKey {
        ObjectKey(Arc::new(ObjectKeyParts {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        }))
    }

    /// The API group (`""` for the core group).
    pub fn group(&self) -> &str {
        self.api_version
            .rsplit_once('/')
            .map(|(g, _)| g)
            .unwrap_or("")
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_order_and_hash_by_their_parts() {
        use std::hash::BuildHasher as _;
        let a = ObjectKey::new("apps/v1", "StatefulSet", "shop", "db");
        let b = ObjectKey::new("apps/v1", "StatefulSet", "shop", "db");
        assert_eq!(a, b);
        assert!(!a.shares_parts(&b) && a.shares_parts(&a.clone()));
        let seed = std::hash::RandomState::new();
        assert_eq!(seed.hash_one(&a), seed.hash_one(&b));
        let mut keys = [
            ObjectKey::new("v1", "ConfigMap", "b", "x"),
            ObjectKey::new("v1", "ConfigMap", "a", "y"),
            ObjectKey::new("apps/v1", "StatefulSet", "", "z"),
            ObjectKey::new("v1", "ConfigMap", "a", "x"),
        ];
        keys.sort();
        let parts: Vec<(&str, &str, &str)> = keys
            .iter()
            .map(|k| {
                (
                    k.api_version.as_str(),
                    k.namespace.as_str(),
                    k.name.as_str(),
                )
            })
            .collect();
        assert_eq!(
            parts,
            [
                ("apps/v1", "", "z"),
                ("v1", "a", "x"),
                ("v1", "a", "y"),
                ("v1", "b", "x")
            ]
        );
        assert_eq!(format!("{a}"), "StatefulSet shop/db");
        assert_eq!(format!("{:?}", a), format!("{:?}", b));
    }
}
