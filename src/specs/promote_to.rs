//! Offline checks of `promoteTo`: when the next environment's path is in the followed
//! directory (the repository's root is followed, say), the rollout it names must be there,
//! of the same kind. A path with no file, or on another branch (`promoteTo.branch`), is
//! outside what this agent reads: the agent finds out when it promotes. A rollout that fails
//! blocks its file, as a broken route does.

use super::{SpecError, SpecSet};
use crate::api::{CanaryDeployment, CanaryStatefulSet, PromoteTo};

impl SpecSet {
    pub(super) fn block_broken_promotions(&mut self) {
        let mut broken: Vec<SpecError> = Vec::new();
        for object in self.objects.values() {
            // Most rollouts have no promotion; they go unparsed.
            if !object.spec.to_json_text_contains("\"promoteTo\"") {
                continue;
            }
            let to: Option<PromoteTo> = match object.key.kind.as_str() {
                "CanaryStatefulSet" => object
                    .spec
                    .typed::<CanaryStatefulSet>()
                    .and_then(|o| o.spec.promote_to.map(|to| *to)),
                "CanaryDeployment" => object
                    .spec
                    .typed::<CanaryDeployment>()
                    .and_then(|o| o.spec.promote_to.map(|to| *to)),
                _ => None,
            };
            // Another branch's files are not in this set: the agent checks when it promotes.
            let Some(to) = to.filter(|t| t.branch.is_none()) else {
                continue;
            };
            let path = to.path.trim_start_matches("./").trim_matches('/');
            let under = |file: &str| {
                file == path || file.strip_prefix(path).is_some_and(|r| r.starts_with('/'))
            };
            let target = to.name.as_deref().unwrap_or(&object.key.name);
            let there: Vec<&super::ObjectKey> = self
                .objects
                .values()
                .filter(|o| under(&o.location.file) && o.key.kind == object.key.kind)
                .map(|o| &o.key)
                .collect();
            let files = self.objects.values().any(|o| under(&o.location.file));
            if !files || there.iter().any(|k| k.name == target) {
                continue;
            }
            let names: Vec<String> = there.iter().map(|k| k.name.clone()).collect();
            broken.push(SpecError {
                location: object.location.clone(),
                message: format!(
                    "{}: spec.promoteTo: no {} {target} under {path} (its {}s there: {}); fix \
                     spec.promoteTo.name or .path",
                    object.key,
                    object.key.kind,
                    object.key.kind,
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ),
            });
        }
        self.block_files(broken);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::specs::SpecSet;
    use crate::specs::load::{LoadOptions, load_file};

    fn redis(name: &str, extra: &str) -> String {
        format!(
            "apiVersion: rollouts.linnet.dev/v1alpha1\nkind: CanaryStatefulSet\nmetadata: \
             {{name: {name}, namespace: demo}}\nspec:\n  replicas: 3\n  image: redis:7.2\n{extra}  \
             template:\n    serviceName: {name}\n    selector: {{matchLabels: {{app: {name}}}}}\n    \
             template:\n      metadata: {{labels: {{app: {name}}}}}\n      spec: {{containers: \
             [{{name: redis, image: redis:7.2}}]}}\n"
        )
    }

    fn set(files: &[(&str, String)]) -> SpecSet {
        let files: BTreeMap<String, _> = files
            .iter()
            .map(|(path, text)| {
                (
                    path.to_string(),
                    load_file(path, text.as_bytes(), &LoadOptions::default()),
                )
            })
            .collect();
        SpecSet::from_files(files)
    }

    #[test]
    fn a_next_environment_that_has_the_rollout_passes_and_one_outside_the_set_is_not_checked() {
        let staging = redis(
            "redis",
            "  promoteTo: {path: production, name: redis-prod}\n",
        );
        let s = set(&[
            ("staging/redis.yaml", staging.clone()),
            ("production/redis.yaml", redis("redis-prod", "")),
        ]);
        assert!(s.errors.is_empty(), "{:?}", s.errors);
        // Production is not in what this agent follows: the agent checks it when it promotes.
        let s = set(&[("staging/redis.yaml", staging)]);
        assert!(s.errors.is_empty(), "{:?}", s.errors);
    }

    #[test]
    fn a_mistyped_next_rollout_is_located_and_blocks_only_its_file() {
        let staging = redis(
            "redis",
            "  promoteTo: {path: production/, name: redis-prd}\n",
        );
        let s = set(&[
            ("staging/redis.yaml", staging),
            ("production/redis.yaml", redis("redis-prod", "")),
        ]);
        assert_eq!(s.errors.len(), 1, "{:?}", s.errors);
        let e = &s.errors[0];
        assert_eq!(&*e.location.file, "staging/redis.yaml");
        assert!(
            e.message.contains(
                "spec.promoteTo: no CanaryStatefulSet redis-prd under production (its \
                 CanaryStatefulSets there: redis-prod)"
            ),
            "{}",
            e.message
        );
        assert_eq!(s.blocked_files, vec!["staging/redis.yaml".to_string()]);
        assert_eq!(s.objects.len(), 1, "production still applies");
    }
}
