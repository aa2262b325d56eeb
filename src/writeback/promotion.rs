//! Promotion between environments (issue 50, `promoteTo`): once a rollout is Stable on its
//! image with no failed analysis, a pull request gives the next environment's rollout (the
//! same kind, under `promoteTo.path`, on `promoteTo.branch` or the followed branch) the same
//! image, and the config keys that changed with it ([`super::config_carry`]), with the
//! evidence. Pure: what to promote (from the rollout in the cluster), where the next rollout
//! is (from the files under the path), and the edit (the one of [`super::revert`]). Pushing
//! is [`super::promotion_branch`]'s, the pull request [`super::reverter`]'s.
//!
//! One pull request per rollout and image (its branch is named after both): found again after
//! a restart, not made when the next environment already runs the image, and closed when a
//! newer image's promotion replaces it.

use k8s_openapi::api::core::v1::PodSpec;

use crate::api::{
    AnalysisRunStatus, CanaryDeployment, CanaryStatefulSet, ConfigKind, DeploymentPhase, PromoteTo,
    RevertMode, SOURCE_PATH_ANNOTATION, StatefulSetPhase,
};

use super::config_carry::Carried;
use super::revert::{Revert, RevertError};

/// The branches of promotion pull requests start with this; then `<namespace>/<name>/`.
pub const BRANCH_PREFIX: &str = "linnet/promote/";

/// A rollout's image to take to the next environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Promotion {
    pub kind: &'static str,
    /// The rollout that passed.
    pub namespace: String,
    pub name: String,
    pub image: String,
    /// Where the next environment's rollout is, from the repository's root.
    pub path: String,
    /// The next environment's rollout's name.
    pub target: String,
    /// What passed: the analysis runs, one per line.
    pub evidence: String,
    /// `promoteTo.autoMerge`: merge the pull request once opened (if the agent allows it).
    pub auto_merge: bool,
    /// `promoteTo.branch`: the next environment's branch, when not the followed one.
    pub branch: Option<String>,
    /// The passed rollout's file, from the repository's root (where its config change is).
    pub source_path: Option<String>,
    /// The ConfigMaps and Secrets its pod template reads: their changed keys are carried.
    pub config: Vec<(ConfigKind, String)>,
}

impl Promotion {
    /// The start of every promotion branch of this rollout.
    pub fn branch_prefix(&self) -> String {
        format!("{BRANCH_PREFIX}{}/{}/", self.namespace, self.name)
    }

    /// This image's branch: a restart finds it again, a newer image gets its own.
    pub fn branch(&self) -> String {
        let image = crate::hash::content_hash(&serde_json::Value::String(self.image.clone()));
        format!("{}{image}", self.branch_prefix())
    }

    pub fn title(&self) -> String {
        format!(
            "Promote {} to {} ({})",
            self.image,
            self.target,
            self.place()
        )
    }

    /// Where the next environment is: its path, and its branch when it has its own.
    pub fn place(&self) -> String {
        match &self.branch {
            Some(branch) => format!("{} on branch {branch}", self.path),
            None => self.path.clone(),
        }
    }

    /// The pull request's body and the commit's: what passed, what merging does, and the
    /// config keys carried and kept (names only).
    pub fn body(&self, next: &Revert, carried: &Carried) -> String {
        let mut config = String::new();
        if !carried.set.is_empty() {
            config.push_str("\n\nThe config that changed with the image comes too, key by key:\n");
            for key in &carried.set {
                config.push_str(&format!("- {key}\n"));
            }
        }
        if !carried.kept.is_empty() {
            config.push_str("\n\nLeft as this environment has it; look at each before merging:\n");
            for key in &carried.kept {
                config.push_str(&format!("- {key}\n"));
            }
        }
        format!(
            "{} {}/{} is Stable on {} with no failed analysis:\n\n{}\n\nMerging this gives \
             {} {} in `{}` the same image (it runs {} now); it then runs its own canary.{}\n\n\
             Written by linnet because {}/{} has `promoteTo`. Its status file: `{}`.\n",
            self.kind,
            self.namespace,
            self.name,
            self.image,
            self.evidence,
            self.kind,
            self.target,
            next.path,
            if next.failed.is_empty() {
                "what its base or chart gives"
            } else {
                next.failed.as_str()
            },
            config.trim_end(),
            self.namespace,
            self.name,
            super::status_files::path("<cluster>", &self.namespace, &self.name)
        )
    }

    /// The commit message.
    pub fn message(&self, next: &Revert, carried: &Carried) -> String {
        format!("linnet: {}\n\n{}", self.title(), self.body(next, carried))
    }
}

/// The analysis runs, a line each with a nested line per metric (its values, condition and
/// query), or a line that says there were none.
fn evidence(runs: &[AnalysisRunStatus]) -> String {
    if runs.is_empty() {
        return "- no analysis is configured; the rollout became Stable".into();
    }
    crate::plan::analysis::report::runs_text(runs, super::EVIDENCE_BYTES)
}

/// What passed, where it came from, and what it reads.
struct Passed<'a> {
    kind: &'static str,
    meta: &'a kube::api::ObjectMeta,
    image: &'a str,
    runs: &'a [AnalysisRunStatus],
    pod: Option<PodSpec>,
}

fn promotion(passed: Passed<'_>, to: &PromoteTo) -> Option<Promotion> {
    let Passed {
        kind,
        meta,
        image,
        runs,
        pod,
    } = passed;
    if crate::plan::analysis::failure(runs).is_some() {
        return None;
    }
    let name = meta.name.clone()?;
    Some(Promotion {
        kind,
        namespace: meta.namespace.clone()?,
        target: to.name.clone().unwrap_or_else(|| name.clone()),
        name,
        image: image.to_string(),
        path: to
            .path
            .trim_start_matches("./")
            .trim_matches('/')
            .to_string(),
        evidence: evidence(runs),
        auto_merge: to.auto_merge,
        branch: to.branch.clone(),
        source_path: meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(SOURCE_PATH_ANNOTATION))
            .cloned(),
        config: pod
            .map(|p| crate::plan::config::references(&p).into_iter().collect())
            .unwrap_or_default(),
    })
}

/// The promotion a CanaryStatefulSet asks for now: Stable on Git's image, no failed analysis.
pub fn for_statefulset(r: &CanaryStatefulSet) -> Option<Promotion> {
    let to = r.spec.promote_to.as_ref()?;
    let st = r.status.as_ref()?;
    if st.phase != Some(StatefulSetPhase::Stable)
        || st.stable_image.as_deref() != Some(r.spec.image.as_str())
    {
        return None;
    }
    let meta = crate::api::packed_meta::metadata(r);
    let passed = Passed {
        kind: "CanaryStatefulSet",
        meta: &meta,
        image: &r.spec.image,
        runs: &st.analysis,
        pod: r.spec.template.get().template.spec,
    };
    promotion(passed, to)
}

/// The promotion a CanaryDeployment asks for now: Completed on Git's image, no failed analysis.
pub fn for_deployment(r: &CanaryDeployment) -> Option<Promotion> {
    let to = r.spec.promote_to.as_ref()?;
    let st = r.status.as_ref()?;
    if st.phase != Some(DeploymentPhase::Completed)
        || st.stable_image.as_deref() != Some(r.spec.image.as_str())
    {
        return None;
    }
    let meta = crate::api::packed_meta::metadata(r);
    let passed = Passed {
        kind: "CanaryDeployment",
        meta: &meta,
        image: &r.spec.image,
        runs: &st.analysis,
        pod: r.spec.template.get().template.spec,
    };
    promotion(passed, to)
}

/// The edit that gives the next environment's rollout the image, found among `files` (path
/// and text, under the promotion's path): in the file that has the rollout, or else in the
/// kustomization or `linnet-helm.yaml` at the path (its rollout is rendered). `Ok(None)` when
/// it runs the image already.
pub fn next_edit<'a>(
    p: &Promotion,
    files: impl IntoIterator<Item = (String, &'a str)>,
) -> Result<Option<Revert>, RevertError> {
    let mut units = Vec::new();
    for (path, text) in files {
        let Some((namespace, image)) = super::revert::rollout_image(text, p.kind, &p.target) else {
            units.push((path, text));
            continue;
        };
        if image == p.image {
            return Ok(None);
        }
        return Ok(Some(Revert {
            path,
            kind: p.kind,
            namespace: namespace.unwrap_or_default(),
            name: p.target.clone(),
            failed: image,
            good: p.image.clone(),
            why: String::new(),
            mode: RevertMode::PullRequest,
            revision: None,
            shared_base: false,
            cluster: None,
            failed_in: None,
        }));
    }
    // Rendered: the overlay or Helm release at the path itself sets the image.
    let unit = |file: &str| {
        let dir = file.rsplit_once('/').map_or("", |(d, _)| d);
        super::rendered_edit::rendered(file).is_some() && (dir == p.path || file == p.path)
    };
    if let Some((path, text)) = units.into_iter().find(|(f, _)| unit(f)) {
        let (repo, _) = super::rendered_edit::split_image(&p.image);
        let now = match super::rendered_edit::rendered(&path) {
            Some(super::rendered_edit::Rendered::Kustomization) => {
                super::rendered_edit::kustomize_image(text, repo)
            }
            _ => None,
        };
        if now.as_deref() == Some(p.image.as_str()) {
            return Ok(None);
        }
        return Ok(Some(Revert {
            path,
            kind: p.kind,
            namespace: String::new(),
            name: p.target.clone(),
            // Empty: whatever the environment runs now is replaced.
            failed: now.unwrap_or_default(),
            good: p.image.clone(),
            why: String::new(),
            mode: RevertMode::PullRequest,
            revision: None,
            shared_base: false,
            cluster: None,
            failed_in: None,
        }));
    }
    Err(RevertError::NotInFile {
        path: p.path.clone(),
        kind: p.kind,
        name: p.target.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn promotion() -> Promotion {
        Promotion {
            kind: "CanaryStatefulSet",
            namespace: "staging".into(),
            name: "redis".into(),
            image: "redis:7.4".into(),
            path: "environments/production".into(),
            target: "redis".into(),
            evidence: "- analysis errors: Successful".into(),
            auto_merge: false,
            branch: None,
            source_path: Some("environments/staging/redis.yaml".into()),
            config: Vec::new(),
        }
    }

    const PROD: &str = "kind: CanaryStatefulSet\nmetadata:\n  name: redis\n  namespace: prod\nspec:\n  image: redis:7.2\n";

    #[test]
    fn the_next_rollout_is_found_under_the_path_and_gets_the_image() {
        let files = [
            (
                "environments/production/web.yaml".to_string(),
                "kind: CanaryDeployment\nmetadata:\n  name: redis\nspec:\n  image: x\n",
            ),
            ("environments/production/redis.yaml".to_string(), PROD),
        ];
        let edit = next_edit(&promotion(), files).unwrap().unwrap();
        assert_eq!(edit.path, "environments/production/redis.yaml");
        assert_eq!(
            (edit.namespace.as_str(), edit.failed.as_str()),
            ("prod", "redis:7.2")
        );
        let text = super::super::revert::set_image(PROD, &edit)
            .unwrap()
            .unwrap();
        assert_eq!(text, PROD.replace("redis:7.2", "redis:7.4"));
        assert!(
            promotion()
                .message(&edit, &Carried::default())
                .starts_with("linnet: Promote redis:7.4 to redis (environments/production)\n\n")
        );
    }

    #[test]
    fn a_next_environment_on_the_image_already_needs_nothing_and_a_missing_one_is_an_error() {
        let on_it = PROD.replace("redis:7.2", "redis:7.4");
        assert_eq!(
            next_edit(&promotion(), [("p.yaml".to_string(), on_it.as_str())]),
            Ok(None)
        );
        let e = next_edit(&promotion(), [("p.yaml".to_string(), "kind: ConfigMap\n")]).unwrap_err();
        assert!(
            e.to_string()
                .contains("environments/production has no CanaryStatefulSet redis"),
            "{e}"
        );
    }

    #[test]
    fn a_rendered_next_environment_gets_the_image_in_its_overlay() {
        let overlay = "resources: [../base]\nnamespace: prod\n";
        let files = [
            (
                "environments/production/kustomization.yaml".to_string(),
                overlay,
            ),
            (
                "environments/production/replicas.yaml".to_string(),
                "kind: X\n",
            ),
        ];
        let edit = next_edit(&promotion(), files).unwrap().unwrap();
        assert_eq!(edit.path, "environments/production/kustomization.yaml");
        // It runs its base's image: whatever that is, replaced.
        assert_eq!(
            (edit.failed.as_str(), edit.good.as_str()),
            ("", "redis:7.4")
        );
        assert!(
            promotion()
                .body(&edit, &Carried::default())
                .contains("(it runs what its base or chart gives now)")
        );
        // Once merged, the overlay gives the image: nothing more to promote.
        let merged = format!("{overlay}images:\n- name: redis\n  newTag: \"7.4\"\n");
        let files = [(
            "environments/production/kustomization.yaml".to_string(),
            merged.as_str(),
        )];
        assert_eq!(next_edit(&promotion(), files), Ok(None));
    }

    #[test]
    fn each_image_has_its_own_branch_under_the_rollouts_prefix() {
        let p = promotion();
        assert!(p.branch().starts_with("linnet/promote/staging/redis/"));
        let mut newer = promotion();
        newer.image = "redis:7.6".into();
        assert_ne!(p.branch(), newer.branch());
    }

    fn web(phase: &str, spec: Value, status: Value) -> CanaryDeployment {
        let mut o = json!({
            "apiVersion": "rollouts.linnet.dev/v1alpha1",
            "kind": "CanaryDeployment",
            "metadata": {"name": "web", "namespace": "demo"},
            "spec": {"replicas": 4, "image": "web:2",
                "template": {"selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "web", "image": "web:2"}]}}}},
            "status": {"phase": phase},
        });
        for (at, patch) in [("spec", spec), ("status", status)] {
            if let (Some(o), Value::Object(p)) = (o[at].as_object_mut(), patch) {
                o.extend(p);
            }
        }
        serde_json::from_value(o).unwrap()
    }

    #[test]
    fn a_deployment_is_promoted_only_when_completed_on_gits_image_with_no_failed_analysis() {
        let to = json!({"promoteTo": {"path": "production"}});
        let done = web("Completed", to.clone(), json!({"stableImage": "web:2"}));
        let p = for_deployment(&done).unwrap();
        assert_eq!((p.image.as_str(), p.target.as_str()), ("web:2", "web"));
        assert!(p.evidence.contains("no analysis is configured"));
        // Still on the old image, or mid-rollout: nothing yet.
        let old = web("Completed", to.clone(), json!({"stableImage": "web:1"}));
        assert!(for_deployment(&old).is_none());
        let paused = web("Paused", to.clone(), json!({"stableImage": "web:2"}));
        assert!(for_deployment(&paused).is_none());
        // A failed analysis is never promoted.
        let failed = web(
            "Completed",
            to,
            json!({"stableImage": "web:2", "analysis": [{"name": "errors",
                "phase": "Failed", "startedAt": "2026-11-27T00:00:00Z", "message": "0.3 > 0.05"}]}),
        );
        assert!(for_deployment(&failed).is_none());
    }
}
