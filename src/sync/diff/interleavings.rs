//! Interleavings of the sync, the traffic controller and hand edits, against a model of
//! the API server's field ownership: no writer of linnet's undoes another's.
//!
//! The model: an API server's field ownership, for one HTTPRoute and the fields the sync, the traffic
//! controller and a person write: each field's value and managers, as server-side apply and
//! updates keep them.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use serde_json::{Value, json};

use crate::api::field_managers::{SYNC, TRAFFIC};
use crate::specs::ObjectKey;
use crate::sync::desired::{APPLIED_HASH_ANNOTATION, DesiredObject};
use crate::sync::diff::{Change, Prune, plan_changes, project_owned};
use crate::sync::ownership::to_apply;

const FIELDS: [&str; 4] = [
    "/metadata/labels/team",
    "/metadata/annotations/rollouts.linnet.dev~1traffic-of",
    "/spec/parentRefs",
    "/spec/rules",
];
const HASH: &str = "/metadata/annotations/rollouts.linnet.dev~1applied-hash";

#[derive(Default)]
struct Server {
    fields: BTreeMap<String, (Value, BTreeSet<&'static str>)>,
}

impl Server {
    fn get(&self, path: &str) -> Option<&Value> {
        self.fields.get(path).map(|(v, _)| v)
    }

    /// A forced server-side apply: `manager` owns what it sends; what it owned and no
    /// longer sends goes unless another manager owns it too.
    fn apply(&mut self, manager: &'static str, object: &Value) {
        for path in FIELDS.iter().copied().chain([hash_path()]) {
            match object.pointer(path) {
                Some(v) => {
                    self.fields
                        .insert(path.into(), (v.clone(), BTreeSet::from([manager])));
                }
                None => {
                    if let Some((_, owners)) = self.fields.get_mut(path) {
                        owners.remove(manager);
                        if owners.is_empty() {
                            self.fields.remove(path);
                        }
                    }
                }
            }
        }
    }

    /// An update: `manager` takes the fields whose value it changes.
    fn update(&mut self, manager: &'static str, path: &str, value: Value) {
        if self.get(path) != Some(&value) {
            self.fields
                .insert(path.into(), (value, BTreeSet::from([manager])));
        }
    }

    fn object(&self) -> Value {
        let mut o = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "shop", "namespace": "default", "uid": "u1"}});
        for (path, (v, _)) in &self.fields {
            set(&mut o, path, v.clone());
        }
        let managers: BTreeSet<&str> = self.fields.values().flat_map(|(_, m)| m).copied().collect();
        let entries: Vec<Value> = managers
            .into_iter()
            .map(|m| {
                let mut fields = json!({});
                for (path, (_, owners)) in &self.fields {
                    if owners.contains(m) {
                        let fv1: String =
                            path.split('/').skip(1).map(|p| format!("/f:{p}")).collect();
                        set(&mut fields, &fv1, json!({}));
                    }
                }
                json!({"manager": m, "operation": if m == SYNC {"Apply"} else {"Update"},
                    "fieldsV1": fields})
            })
            .collect();
        o["metadata"]["managedFields"] = Value::Array(entries);
        o
    }
}

fn hash_path() -> &'static str {
    HASH
}

/// Sets `value` at JSON pointer `path` (`~1` is `/`), making objects on the way.
fn set(o: &mut Value, path: &str, value: Value) {
    let parts: Vec<String> = path
        .split('/')
        .skip(1)
        .map(|p| p.replace("~1", "/"))
        .collect();
    let mut at = o;
    for p in &parts[..parts.len() - 1] {
        if !at.get(p).is_some_and(Value::is_object) {
            at[p.as_str()] = json!({});
        }
        at = &mut at[p.as_str()];
    }
    at[parts[parts.len() - 1].as_str()] = value;
}

fn git(version: u8) -> DesiredObject {
    let object = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "shop", "namespace": "default",
            "labels": {"team": format!("t{version}")},
            "annotations": {APPLIED_HASH_ANNOTATION: format!("h{version}")}},
        "spec": {"parentRefs": [{"name": format!("gw{version}")}],
            "rules": [{"backendRefs": [{"name": format!("stable{version}")}]}]}});
    DesiredObject {
        key: ObjectKey::new(
            "gateway.networking.k8s.io/v1",
            "HTTPRoute",
            "default",
            "shop",
        ),
        object: crate::specs::Spec::new(&object),
        hash: format!("h{version}"),
        source_path: "route.yaml".into(),
        location: crate::specs::Location {
            file: "route.yaml".into(),
            line: 1,
            column: 1,
        },
    }
}

/// A sync of `desired`, as `Syncer` makes it: the live object cut down to Git's fields,
/// planned, and applied if the plan says so.
fn sync(server: &mut Server, desired: &DesiredObject) {
    let live = server.object();
    let projected = project_owned(&desired.value(), &live);
    let plan = plan_changes(
        vec![desired.clone()],
        &BTreeMap::from([(desired.key.clone(), projected)]),
        &Default::default(),
        Prune::OFF,
    );
    if plan[0].change == Change::Update {
        server.apply(SYNC, &to_apply(desired, plan[0].live.as_ref()));
    }
}

/// The traffic controller: rewrites the live rules' backends to the weight, and marks the
/// route as the rollout's.
fn weigh(server: &mut Server, weight: i64) -> Option<Value> {
    let rules = server.get("/spec/rules")?;
    let stable = rules.pointer("/0/backendRefs/0/name")?.clone();
    let weighed = json!([{"backendRefs": [{"name": stable, "weight": 100 - weight},
        {"name": "canary", "weight": weight}]}]);
    server.update(TRAFFIC, FIELDS[1], json!("CanaryDeployment/shop"));
    server.update(TRAFFIC, "/spec/rules", weighed.clone());
    Some(weighed)
}

#[derive(Clone, Debug)]
enum Op {
    GitChanges,
    Weigh(i64),
    HandEditsLabel,
    HandEditsParents,
    HandEditsRules,
    DriftCheck,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::GitChanges),
        (0i64..=100).prop_map(Op::Weigh),
        Just(Op::HandEditsLabel),
        Just(Op::HandEditsParents),
        Just(Op::HandEditsRules),
        Just(Op::DriftCheck),
    ]
}

proptest! {
    /// For any interleaving of Git applies, traffic writes, hand edits and drift checks: a
    /// drift check never undoes the traffic controller's write, and puts back every other
    /// field Git sets; a change in Git is applied whole.
    #[test]
    fn no_writer_of_linnets_undoes_another(ops in proptest::collection::vec(op(), 1..40)) {
        let mut server = Server::default();
        let mut version = 0u8;
        sync(&mut server, &git(version));
        // The traffic controller's rules while they are still its own.
        let mut weighed: Option<Value> = None;
        for op in ops {
            match op {
                Op::GitChanges => {
                    version += 1;
                    sync(&mut server, &git(version));
                    let want = git(version).value();
                    for path in [FIELDS[0], FIELDS[2], FIELDS[3]] {
                        prop_assert_eq!(server.get(path), want.pointer(path), "{} after a Git change", path);
                    }
                    weighed = None;
                }
                Op::Weigh(w) => weighed = weigh(&mut server, w),
                Op::HandEditsLabel => server.update("kubectl-edit", FIELDS[0], json!("mine")),
                Op::HandEditsParents => server.update("kubectl-edit", FIELDS[2], json!([{"name": "mine"}])),
                Op::HandEditsRules => {
                    server.update("kubectl-edit", FIELDS[3], json!([{"backendRefs": [{"name": "mine"}]}]));
                    weighed = None;
                }
                Op::DriftCheck => {
                    let before = server.get("/spec/rules").cloned();
                    sync(&mut server, &git(version));
                    let want = git(version).value();
                    for path in [FIELDS[0], FIELDS[2]] {
                        prop_assert_eq!(server.get(path), want.pointer(path), "{} after a drift check", path);
                    }
                    match &weighed {
                        Some(rules) => prop_assert_eq!(server.get("/spec/rules"), Some(rules), "the weights were undone (before: {:?})", before),
                        None => prop_assert_eq!(server.get("/spec/rules"), want.pointer("/spec/rules")),
                    }
                }
            }
        }
    }
}
