//! [`Embedded`]: a Kubernetes object embedded in a rollout (its StatefulSet or Deployment
//! spec), kept as compact JSON and read on demand.
//!
//! Every rollout the agent runs sits in a store for as long as it exists. A typed
//! `StatefulSetSpec` holds every optional field of its pod template even when empty: about
//! 4.5 KB for a one-container template, more than the rest of the rollout together (heap
//! profile at 1,000 rollouts, bench/RESULTS.md). Its JSON is a few hundred bytes. A
//! reconcile reads the template once or twice, and parsing it back costs microseconds.

use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A `T` kept as the compact JSON its own `Serialize` wrote. It (de)serializes exactly as `T`
/// does, so the CRD, the YAML in Git and the spec loader's error paths and unknown-field
/// checks see `T` itself. Two are equal when their JSON is, which is when the `T`s are:
/// serialization is deterministic.
pub struct Embedded<T> {
    json: Box<str>,
    of: PhantomData<fn() -> T>,
}

impl<T: Serialize + DeserializeOwned + Default> Embedded<T> {
    /// Keeps `value`.
    pub fn new(value: &T) -> Embedded<T> {
        let json = match serde_json::to_string(value) {
            Ok(json) => json,
            // Kubernetes types have string keys only, so this does not happen.
            Err(e) => {
                tracing::error!(error = %e, "an embedded object could not be written as JSON");
                "{}".to_owned()
            }
        };
        Embedded {
            json: json.into_boxed_str(),
            of: PhantomData,
        }
    }

    /// The object, parsed again.
    pub fn get(&self) -> T {
        serde_json::from_str(&self.json).unwrap_or_else(|e| {
            // The text was written by `T`'s own `Serialize`, so this does not happen.
            tracing::error!(error = %e, "an embedded object could not be read back");
            T::default()
        })
    }

    /// Changes the object with `change`.
    pub fn update(&mut self, change: impl FnOnce(&mut T)) {
        let mut value = self.get();
        change(&mut value);
        *self = Embedded::new(&value);
    }
}

impl<T> Clone for Embedded<T> {
    fn clone(&self) -> Embedded<T> {
        Embedded {
            json: self.json.clone(),
            of: PhantomData,
        }
    }
}

impl<T> PartialEq for Embedded<T> {
    fn eq(&self, other: &Embedded<T>) -> bool {
        self.json == other.json
    }
}

impl<T> Eq for Embedded<T> {}

impl<T> std::fmt::Debug for Embedded<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.json)
    }
}

impl<T: Serialize + DeserializeOwned + Default> Serialize for Embedded<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.get().serialize(serializer)
    }
}

impl<'de, T: Serialize + DeserializeOwned + Default> Deserialize<'de> for Embedded<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Embedded<T>, D::Error> {
        // `T` reads the input itself, so errors and ignored fields keep their paths.
        T::deserialize(deserializer).map(|value| Embedded::new(&value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::StatefulSetSpec;

    fn spec() -> serde_json::Value {
        serde_json::json!({
            "serviceName": "redis",
            "selector": {"matchLabels": {"app": "redis"}},
            "template": {
                "metadata": {"labels": {"app": "redis"}},
                "spec": {"containers": [{"name": "redis", "image": "redis:7"}]}
            }
        })
    }

    #[test]
    fn it_reads_and_writes_as_the_object_itself() {
        let embedded: Embedded<StatefulSetSpec> = serde_json::from_value(spec()).unwrap();
        let typed: StatefulSetSpec = serde_json::from_value(spec()).unwrap();
        assert_eq!(embedded.get(), typed);
        assert_eq!(serde_json::to_value(&embedded).unwrap(), spec());
        assert_eq!(embedded, Embedded::new(&typed));
    }

    #[test]
    fn it_keeps_far_less_than_the_typed_object() {
        let embedded: Embedded<StatefulSetSpec> = serde_json::from_value(spec()).unwrap();
        let typed = std::mem::size_of::<StatefulSetSpec>()
            + std::mem::size_of::<k8s_openapi::api::core::v1::Container>();
        assert!(embedded.json.len() * 10 < typed, "{}", embedded.json);
    }

    #[test]
    fn update_changes_the_object() {
        let mut embedded: Embedded<StatefulSetSpec> = serde_json::from_value(spec()).unwrap();
        embedded.update(|s| s.replicas = Some(3));
        assert_eq!(embedded.get().replicas, Some(3));
        assert!(embedded.json.contains("\"replicas\":3"));
    }

    #[test]
    fn a_type_error_keeps_its_path_through_the_wrapper() {
        let mut bad = spec();
        bad["template"]["spec"]["containers"][0]["image"] = serde_json::json!(7);
        let e = serde_json::from_value::<Embedded<StatefulSetSpec>>(bad).unwrap_err();
        assert!(e.to_string().contains("invalid type"), "{e}");
    }
}
