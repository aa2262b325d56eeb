//! A fleet's revert (issue 73, `onFailure: revert` in the Fleet): an image that failed in one
//! cluster goes back in every other cluster of the fleet that completed it, each by a pull
//! request its own agent opens on its own spec file (an overlay per cluster that sets the
//! image itself). No agent edits another cluster's files; each learns of the failure from the
//! failed cluster's status file in Git. Where the image is set in a base the overlays share,
//! the failed cluster's own revert puts every wave back ([`super::image_edit`]), and this one
//! finds nothing of its own to edit. Pure: what this cluster's settled rollout and the fleet
//! as read from Git ask for.

use crate::api::{
    CanaryDeployment, CanaryStatefulSet, ClusterIdentity, DeploymentPhase, RevertMode,
    SOURCE_PATH_ANNOTATION, StatefulSetPhase,
};
use crate::plan::fleet::FleetSnapshot;

use super::revert::Revert;

/// A rollout settled on the image its spec asks for, with the file that sets it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    /// The spec file, from the repository's root.
    pub path: String,
    pub image: String,
}

/// A CanaryStatefulSet Stable on its spec's image.
pub fn settled_statefulset(r: &CanaryStatefulSet) -> Option<Settled> {
    let st = r.status.as_ref()?;
    let on_spec = st.stable_image.as_deref() == Some(r.spec.image.as_str());
    (st.phase == Some(StatefulSetPhase::Stable) && on_spec).then_some(())?;
    let meta = crate::api::packed_meta::metadata(r);
    settled("CanaryStatefulSet", &meta, &r.spec.image)
}

/// A CanaryDeployment Completed on its spec's image.
pub fn settled_deployment(r: &CanaryDeployment) -> Option<Settled> {
    let st = r.status.as_ref()?;
    let on_spec = st.stable_image.as_deref() == Some(r.spec.image.as_str());
    (st.phase == Some(DeploymentPhase::Completed) && on_spec).then_some(())?;
    let meta = crate::api::packed_meta::metadata(r);
    settled("CanaryDeployment", &meta, &r.spec.image)
}

fn settled(kind: &'static str, meta: &kube::api::ObjectMeta, image: &str) -> Option<Settled> {
    Some(Settled {
        kind,
        namespace: meta.namespace.clone()?,
        name: meta.name.clone()?,
        path: meta
            .annotations
            .as_ref()?
            .get(SOURCE_PATH_ANNOTATION)?
            .clone(),
        image: image.to_string(),
    })
}

/// The revert `settled` asks for in cluster `me`, as `fleet` says: a pull request that puts
/// back the image the failed cluster went back to, if its image failed elsewhere.
pub fn fleet_revert(s: &Settled, fleet: &FleetSnapshot, me: &ClusterIdentity) -> Option<Revert> {
    let id = (s.kind, s.namespace.as_str(), s.name.as_str());
    let failure = fleet.failure_to_revert(me, id, &s.image)?;
    Some(Revert {
        path: s.path.clone(),
        kind: s.kind,
        namespace: s.namespace.clone(),
        name: s.name.clone(),
        failed: s.image.clone(),
        good: failure.good,
        why: format!(
            "it failed in cluster {} ({}) of fleet {}",
            failure.cluster, failure.phase, fleet.name
        ),
        mode: RevertMode::PullRequest,
        // Named by the failed image, not by this spec's commit: a later commit that leaves
        // the image alone must not make a new pull request (nor reopen one a person closed).
        revision: None,
        shared_base: false,
        cluster: Some(me.name.clone()),
        failed_in: Some(failure.cluster),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fleet::Report;

    fn web(phase: &str, stable: &str, spec: &str) -> CanaryDeployment {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "rollouts.linnet.dev/v1alpha1",
            "kind": "CanaryDeployment",
            "metadata": {
                "name": "web", "namespace": "shop",
                "annotations": {SOURCE_PATH_ANNOTATION: "clusters/eu-1/kustomization.yaml"}
            },
            "spec": {"replicas": 2, "image": spec, "template": {"spec": {"containers": [
                {"name": "web", "image": spec}]}}},
            "status": {"phase": phase, "stableImage": stable, "sourceRevision": "0123456789abcdef"}
        }))
        .unwrap()
    }

    fn fleet(policy: &str, eu2: Report) -> FleetSnapshot {
        let mut f = FleetSnapshot {
            name: "shop".into(),
            spec: serde_saphyr::from_str(&format!(
                "waves:\n- {{name: one, clusters: [eu-1]}}\n- {{name: two, clusters: [eu-2]}}\n\
                 onFailure: {policy}\n"
            ))
            .unwrap(),
            ..Default::default()
        };
        let id = ("CanaryDeployment".into(), "shop".into(), "web".into());
        f.reports.insert(id, [("eu-2".to_string(), eu2)].into());
        f
    }

    fn rolled_back() -> Report {
        Report {
            phase: "RolledBack".into(),
            stable_image: Some("web:4".into()),
            canary_image: Some("web:5".into()),
            wanted_image: Some("web:5".into()),
            since: None,
        }
    }

    #[test]
    fn a_cluster_that_completed_an_image_that_failed_later_proposes_the_image_before() {
        let eu1 = ClusterIdentity {
            name: "eu-1".into(),
            labels: Default::default(),
        };
        let settled = settled_deployment(&web("Completed", "web:5", "web:5")).unwrap();
        let r = fleet_revert(&settled, &fleet("revert", rolled_back()), &eu1).unwrap();
        assert_eq!((r.failed.as_str(), r.good.as_str()), ("web:5", "web:4"));
        assert_eq!(r.path, "clusters/eu-1/kustomization.yaml");
        assert_eq!(r.mode, RevertMode::PullRequest);
        let branch = r.branch();
        assert!(
            branch.starts_with("linnet/fleet-revert/@eu-1/shop/web/"),
            "{branch}"
        );
        // The same failed image after another commit to the spec: the same pull request
        // (one a person closed stays closed).
        let mut later = web("Completed", "web:5", "web:5");
        later.status.as_mut().unwrap().source_revision = Some("fedcba9876543210".into());
        let later = settled_deployment(&later).unwrap();
        let again = fleet_revert(&later, &fleet("revert", rolled_back()), &eu1);
        assert_eq!(again.map(|a| a.branch()), Some(branch));
        assert_eq!(r.title(), "Revert shop/web in eu-1 to web:4");
        let body = r.body();
        assert!(
            body.contains("failed in cluster eu-2 (RolledBack) of fleet shop"),
            "{body}"
        );
        assert!(body.contains(".linnet/status/eu-1/shop/"), "{body}");
        // Apart from the rollout's own reverts, which a cluster closes once Git moved on.
        assert!(
            !r.branch().starts_with(&super::super::revert::branch_prefix(
                Some("eu-1"),
                "shop",
                "web"
            ))
        );
        // `stop`, not settled on the image, or no failure: nothing.
        assert_eq!(
            fleet_revert(&settled, &fleet("stop", rolled_back()), &eu1),
            None
        );
        let fine = Report {
            phase: "Completed".into(),
            stable_image: Some("web:5".into()),
            canary_image: None,
            ..rolled_back()
        };
        assert_eq!(fleet_revert(&settled, &fleet("revert", fine), &eu1), None);
        for (phase, stable, spec) in [
            ("Progressing", "web:4", "web:5"),
            ("Completed", "web:4", "web:5"),
        ] {
            assert_eq!(settled_deployment(&web(phase, stable, spec)), None);
        }
    }
}
