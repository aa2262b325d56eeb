//! `linnet get` without a name: one line per rollout of either kind, as `kubectl get` prints
//! a list. Pure, like the tree.

use crate::api::RolloutView;

use super::object::RolloutObject;
use super::table::Table;

/// The columns a list shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListColumns {
    /// A NAMESPACE column first (`-A`).
    pub namespace: bool,
    /// The step or batch, the source and the message too (`-o wide`).
    pub wide: bool,
}

/// The list as text, `now` for ages; rollouts sorted by namespace, kind and name.
pub fn render(rollouts: &[RolloutObject], columns: ListColumns, now: jiff::Timestamp) -> String {
    let mut header = Vec::new();
    if columns.namespace {
        header.push("NAMESPACE");
    }
    header.extend(["NAME", "PHASE", "READY", "IMAGES", "AGE"]);
    if columns.wide {
        header.extend(["STEP", "WEIGHT", "SOURCE", "MESSAGE"]);
    }
    let mut table = Table::new(&header);
    let mut rows: Vec<Vec<String>> = rollouts
        .iter()
        .map(|r| match r {
            RolloutObject::StatefulSet(r) => line(r.as_ref(), columns, now),
            RolloutObject::Deployment(r) => line(r.as_ref(), columns, now),
        })
        .collect();
    rows.sort();
    for row in rows {
        table.push(row);
    }
    table.render()
}

/// One rollout's cells; NAME is `kind/name`, as `kubectl get` names rows of several kinds.
fn line<R: RolloutView>(r: &R, columns: ListColumns, now: jiff::Timestamp) -> Vec<String> {
    let meta = r.meta();
    let mut cells = Vec::new();
    if columns.namespace {
        cells.push(meta.namespace.clone().unwrap_or_default());
    }
    cells.push(format!(
        "{}/{}",
        R::SHORT_NAME,
        meta.name.as_deref().unwrap_or_default()
    ));
    cells.push(r.phase_name().unwrap_or("-").to_string());
    cells.push(r.ready().unwrap_or("-").to_string());
    cells.push(images(r));
    cells.push(
        meta.creation_timestamp
            .as_ref()
            .map_or("-".into(), |t| super::tree::age(now, t.0)),
    );
    if columns.wide {
        let step = match (r.step(), r.batch()) {
            (_, Some(batch)) => format!("batch {batch}"),
            (Some(step), None) => format!("step {}", step + 1),
            (None, None) => "-".into(),
        };
        cells.push(step);
        cells.push(r.canary_weight().map_or("-".into(), |w| format!("{w}%")));
        cells.push(
            meta.annotations
                .as_ref()
                .and_then(|a| a.get(crate::api::SOURCE_PATH_ANNOTATION))
                .cloned()
                .unwrap_or_else(|| "(not from Git)".into()),
        );
        cells.push(r.message().unwrap_or("-").to_string());
    }
    cells
}

/// The stable image, and the canary's after an arrow while one runs.
fn images<R: RolloutView>(r: &R) -> String {
    match (r.stable_image(), r.canary_image()) {
        (Some(s), Some(c)) if s != c => format!("{s} -> {c}"),
        (Some(s), _) => s.to_string(),
        (None, Some(c)) => format!("-> {c}"),
        (None, None) => r.spec_image().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CanaryDeployment, CanaryStatefulSet};

    fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    fn rollouts() -> Vec<RolloutObject> {
        let t = "2023-11-14T22:13:20Z";
        let redis: CanaryStatefulSet = from(serde_json::json!({
            "metadata": {"name": "redis", "namespace": "demo", "creationTimestamp": t,
                "annotations": {"rollouts.linnet.dev/source-path": "apps/redis.yaml"}},
            "spec": {"replicas": 3, "image": "redis:2", "strategy": {"type": "TwoSets"},
                "canaryReplicas": 2, "steps": [1, 2], "template": {}},
            "status": {"phase": "CanaryActive", "stableImage": "redis:1",
                "canaryImage": "redis:2", "ready": "3/3", "currentStep": 0,
                "message": "waiting for promotion"}
        }));
        let web: CanaryDeployment = from(serde_json::json!({
            "metadata": {"name": "web", "namespace": "a-team", "creationTimestamp": t},
            "spec": {"replicas": 4, "image": "web:1", "template": {}}
        }));
        vec![
            RolloutObject::StatefulSet(Box::new(redis)),
            RolloutObject::Deployment(Box::new(web)),
        ]
    }

    #[test]
    fn a_list_names_each_row_by_kind_and_sizes_columns_to_their_content() {
        let now = jiff::Timestamp::from_second(1_700_000_100).unwrap();
        let text = render(&rollouts(), ListColumns::default(), now);
        assert_eq!(
            text,
            "NAME         PHASE         READY  IMAGES              AGE\n\
             cdeploy/web  -             -      web:1               100s\n\
             csts/redis   CanaryActive  3/3    redis:1 -> redis:2  100s\n"
        );
    }

    #[test]
    fn all_namespaces_and_wide_add_their_columns() {
        let now = jiff::Timestamp::from_second(1_700_000_100).unwrap();
        let text = render(
            &rollouts(),
            ListColumns {
                namespace: true,
                wide: true,
            },
            now,
        );
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NAMESPACE  NAME"), "{text}");
        assert!(
            lines[0].ends_with("STEP    WEIGHT  SOURCE           MESSAGE"),
            "{text}"
        );
        assert!(lines[1].starts_with("a-team     cdeploy/web"), "{text}");
        assert!(lines[1].contains("(not from Git)"), "{text}");
        assert!(
            lines[2].ends_with("step 1  -       apps/redis.yaml  waiting for promotion"),
            "{text}"
        );
    }
}
