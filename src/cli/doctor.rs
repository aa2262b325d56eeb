//! `linnet doctor`: the traps a new install falls into, looked for against the cluster of the
//! kubeconfig and, given one, a checkout of the repository: the API server and its clock,
//! linnet's CRDs against this binary's, the agent's Deployment and its image, rollout pods that
//! cannot pull their image, the namespaces and grants the repository's objects need, the
//! render tools it needs, and the Git host. Run in the agent's pod (`kubectl exec deploy/linnet
//! -- linnet doctor`) it reads the agent's own settings from its environment.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;

use super::*;
use crate::error::kube_message;

mod access;
pub mod judge;

pub use judge::{Finding, Verdict};

/// `linnet doctor`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct DoctorArgs {
    /// A checkout of the GitOps repository: its specs are read as `validate` reads them, and
    /// the namespaces, grants and render tools they need are checked.
    pub dir: Option<PathBuf>,
    /// The repository the agent follows: whether it answers and has --branch, logged in to
    /// as the agent does (run in the agent's pod, doctor takes its credentials).
    #[arg(long, env = "LINNET_REPO_URL")]
    pub repo_url: Option<String>,
    /// The branch the agent follows.
    #[arg(long, default_value = "main", env = "LINNET_BRANCH")]
    pub branch: String,
    #[command(flatten)]
    pub git_auth: GitAuthArgs,
    /// A PEM file with the CA of a Git host with a private CA, trusted besides the system's
    /// (as the agent's --ca-file).
    #[arg(long, env = "LINNET_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// How long the API server and the Git host may take to answer each question.
    #[arg(long, default_value = "10s", value_parser = args::parse_duration)]
    pub timeout: Duration,
    /// The agent's ServiceAccount, which acts as the source's account (deploy/rbac.yaml).
    #[arg(long, default_value = "linnet")]
    pub agent_account: String,
    #[command(flatten)]
    pub specs: SpecArgs,
    #[command(flatten)]
    pub sync: SyncArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Where the agent runs when nothing says otherwise (deploy/ and the chart's default).
const DEFAULT_AGENT_NAMESPACE: &str = "linnet-system";
/// The label deploy/ and the chart put on the agent's Deployment and pods.
const AGENT_SELECTOR: &str = "app.kubernetes.io/name=linnet";
/// Rollout pods that cannot pull their image, named at most.
const MAX_NAMED_PODS: usize = 10;

impl DoctorArgs {
    fn agent_namespace(&self) -> &str {
        self.specs
            .agent_namespace
            .as_deref()
            .unwrap_or(DEFAULT_AGENT_NAMESPACE)
    }
}

/// Runs every check, printing each finding as it comes; exit 1 when one failed.
pub(super) fn doctor(args: &DoctorArgs) -> Result<ExitCode> {
    let mut worst = Verdict::Ok;
    let mut counts = BTreeMap::new();
    let mut out = |f: Finding| {
        say!("{f}");
        worst = worst.max(f.verdict);
        *counts.entry(f.verdict).or_insert(0usize) += 1;
    };
    let set = match &args.dir {
        Some(dir) => repository_checks(dir, args, &mut out),
        None => None,
    };
    if let Some(url) = &args.repo_url {
        out(match args.git_auth.auth() {
            Ok(auth) => git_host(url, &args.branch, auth, args.timeout),
            Err(e) => Finding::fail("git", e.to_string()),
        });
    }
    runtime()?.block_on(cluster_checks(args, set.as_ref(), &mut out));
    let count = |v| counts.get(&v).copied().unwrap_or(0);
    say!(
        "{} ok, {} warning(s), {} failed",
        count(Verdict::Ok),
        count(Verdict::Warn),
        count(Verdict::Fail)
    );
    Ok(match worst {
        Verdict::Fail => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    })
}

/// The specs of `dir` (their errors counted, not listed: `validate` lists them) and the
/// render tools its units need.
fn repository_checks(
    dir: &Path,
    args: &DoctorArgs,
    out: &mut impl FnMut(Finding),
) -> Option<crate::specs::SpecSet> {
    let opts = args.specs.load_options();
    let render = args.specs.render.render_options();
    let listed = match crate::specs::list_local_spec_files(dir, &opts.shape) {
        Ok(files) => files,
        Err(e) => {
            out(Finding::fail(
                "specs",
                format!("cannot read {}: {e}", dir.display()),
            ));
            return None;
        }
    };
    let units = |names: &[&str]| {
        listed
            .iter()
            .filter(|f| opts.selection.selects(&f.rel))
            .filter(|f| names.contains(&f.rel.rsplit('/').next().unwrap_or_default()))
            .count()
    };
    let tools = [
        (
            "kustomize",
            &render.kustomize,
            units(&crate::render::KUSTOMIZATION_NAMES),
        ),
        ("helm", &render.helm, units(&[crate::render::HELM_FILE])),
    ];
    for (name, tool, needed_by) in tools {
        if needed_by > 0 {
            out(render_tool(name, tool, needed_by));
        }
    }
    let set = match crate::source::snapshot::load_tree(dir, &opts, render) {
        Ok(set) => set,
        Err(e) => {
            out(Finding::fail("specs", e.to_string()));
            return None;
        }
    };
    out(match set.errors.len() {
        0 => Finding::ok("specs", format!("{} objects, no errors", set.objects.len())),
        n => Finding::warn(
            "specs",
            format!(
                "{n} error(s) block their files: `linnet validate {}` names each",
                dir.display()
            ),
        ),
    });
    Some(set)
}

/// Whether `tool` runs (`tool version`), for the units that need it.
fn render_tool(name: &str, tool: &Path, needed_by: usize) -> Finding {
    let advice = format!(
        "`make install` puts it in ../lib/linnet beside linnet, the image ships it; or give \
         --{name} PATH"
    );
    match std::process::Command::new(tool).arg("version").output() {
        Ok(o) if o.status.success() => {
            let version = String::from_utf8_lossy(&o.stdout);
            let version = version.lines().next().unwrap_or_default().trim();
            Finding::ok("render", format!("{name} runs ({version})"))
        }
        Ok(o) => Finding::fail(
            "render",
            format!(
                "{} version failed ({}), and {needed_by} unit(s) need it; {advice}",
                tool.display(),
                o.status
            ),
        ),
        Err(e) => Finding::fail(
            "render",
            format!(
                "{name} cannot be run as {} ({e}), and {needed_by} unit(s) need it; {advice}",
                tool.display()
            ),
        ),
    }
}

/// Whether the Git host answers and has the branch, asked as the agent asks (no objects).
fn git_host(
    url: &str,
    branch: &str,
    auth: crate::source::git::GitAuth,
    timeout: Duration,
) -> Finding {
    use crate::source::git::{GitMirror, GitRemote};
    let dir = std::env::temp_dir().join(format!("linnet-doctor-{}", std::process::id()));
    let remote = GitRemote {
        url: url.to_string(),
        branch: branch.to_string(),
        auth,
    };
    let tip = GitMirror::open(&dir, remote).and_then(|mut mirror| {
        mirror.set_deadline(Some(timeout));
        mirror.remote_tip()
    });
    let _ = std::fs::remove_dir_all(&dir);
    match tip {
        Ok(tip) => Finding::ok(
            "git",
            format!(
                "{} answers; {branch} is at {:.12}",
                crate::text::redact_credentials(url),
                tip.to_string()
            ),
        ),
        Err(e) => Finding::fail("git", crate::text::redact_credentials(&e.to_string())),
    }
}

/// Everything asked of the cluster, each step within `--timeout`.
async fn cluster_checks(
    args: &DoctorArgs,
    set: Option<&crate::specs::SpecSet>,
    out: &mut impl FnMut(Finding),
) {
    let wait = args.timeout;
    let client =
        match tokio::time::timeout(wait, crate::kube_client::connect_to(&args.cluster.target()))
            .await
        {
            Ok(Ok((_, client))) => client,
            Ok(Err(e)) => return out(Finding::fail("cluster", format!("cannot connect: {e}"))),
            Err(_) => return out(Finding::fail("cluster", no_answer(wait))),
        };
    match tokio::time::timeout(wait, access::version_and_clock(&client)).await {
        Ok(Ok((version, skew))) => {
            out(Finding::ok("cluster", version));
            if let Some(skew) = skew {
                out(judge::judge_clock(skew));
            }
        }
        Ok(Err(e)) => return out(Finding::fail("cluster", format!("cannot ask: {e}"))),
        Err(_) => return out(Finding::fail("cluster", no_answer(wait))),
    }
    let steps = async {
        crds(&client, out).await;
        agent(&client, args.agent_namespace(), out).await;
        rollout_pods(&client, out).await;
        if let Some(set) = set {
            namespaces(&client, set, out).await;
            access::grants(&client, set, args, out).await;
        }
    };
    if tokio::time::timeout(wait * 6, steps).await.is_err() {
        out(Finding::fail("cluster", no_answer(wait * 6)));
    }
}

fn no_answer(wait: Duration) -> String {
    format!(
        "no answer within {}s (--timeout): is the API server reachable from here?",
        wait.as_secs()
    )
}

/// linnet's CRDs in the cluster against this binary's.
async fn crds(client: &kube::Client, out: &mut impl FnMut(Finding)) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for wanted in crate::api::crds() {
        let name = wanted.metadata.name.clone().unwrap_or_default();
        match api.get_opt(&name).await {
            Ok(installed) => out(judge::judge_crd(installed.as_ref(), &wanted)),
            Err(e) => out(Finding::warn(
                "crd",
                format!("cannot read {name}: {}", kube_message(&e)),
            )),
        }
    }
}

/// The agent's Deployment in `namespace`: there, ready, and its pods' images pullable.
async fn agent(client: &kube::Client, namespace: &str, out: &mut impl FnMut(Finding)) {
    let labelled = ListParams::default().labels(AGENT_SELECTOR);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    match deployments.list(&labelled).await {
        Ok(list) if list.items.is_empty() => out(Finding::warn(
            "agent",
            format!(
                "no Deployment labelled {AGENT_SELECTOR} in namespace {namespace}: install the \
                 agent (docs/getting-started.md), or give --agent-namespace"
            ),
        )),
        Ok(list) => {
            for d in list.items {
                out(judge::judge_agent(&d));
            }
        }
        Err(e) => out(Finding::warn(
            "agent",
            format!(
                "cannot read Deployments in {namespace}: {}",
                kube_message(&e)
            ),
        )),
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    if let Ok(list) = pods.list(&labelled).await {
        for (pod, image, message) in judge::image_pull_failures(&list.items) {
            out(Finding::fail(
                "agent image",
                format!(
                    "{pod} cannot pull {image} ({message}): push that image, or point the \
                     Deployment at one that exists (examples/install-overlay)"
                ),
            ));
        }
    }
}

/// Rollout pods in any namespace that wait for an image their node cannot pull.
async fn rollout_pods(client: &kube::Client, out: &mut impl FnMut(Finding)) {
    let pods: Api<Pod> = Api::all(client.clone());
    let params = ListParams::default()
        .labels(crate::api::ROLLOUT_LABEL)
        .limit(500);
    let list = match pods.list(&params).await {
        Ok(list) => list,
        Err(e) => {
            return out(Finding::warn(
                "rollout images",
                format!("cannot list pods: {}", kube_message(&e)),
            ));
        }
    };
    let failures = judge::image_pull_failures(&list.items);
    if failures.is_empty() {
        return out(Finding::ok(
            "rollout images",
            format!(
                "{} rollout pod(s), none waiting for an image",
                list.items.len()
            ),
        ));
    }
    for (pod, image, message) in failures.iter().take(MAX_NAMED_PODS) {
        out(Finding::fail(
            "rollout images",
            format!(
                "{pod} cannot pull {image} ({message}): a rollout whose canary cannot start \
                 fails at its progress deadline; fix the image in Git"
            ),
        ));
    }
}

/// The namespaces the repository's objects use: there, or made by a Namespace in it.
async fn namespaces(
    client: &kube::Client,
    set: &crate::specs::SpecSet,
    out: &mut impl FnMut(Finding),
) {
    let made: BTreeSet<&str> = set
        .objects
        .keys()
        .filter(|k| k.kind == "Namespace" && k.api_version == "v1")
        .map(|k| k.name.as_str())
        .collect();
    let used: BTreeSet<&str> = set
        .objects
        .keys()
        .map(|k| k.namespace.as_str())
        .filter(|ns| !ns.is_empty() && !made.contains(ns))
        .collect();
    let api: Api<Namespace> = Api::all(client.clone());
    for ns in used {
        match api.get_opt(ns).await {
            Ok(Some(_)) => out(Finding::ok("namespace", format!("{ns} exists"))),
            Ok(None) => out(Finding::fail(
                "namespace",
                format!(
                    "{ns} does not exist, and no Namespace in the repository makes it: \
                     `kubectl create namespace {ns}`, or a Namespace in Git with \
                     --allow-cluster-kind Namespace"
                ),
            )),
            Err(e) => out(Finding::warn(
                "namespace",
                format!("cannot read namespace {ns}: {}", kube_message(&e)),
            )),
        }
    }
}

/// `api_version` split into group and version, and the GVK of `kind` in it.
fn gvk_of(api_version: &str, kind: &str) -> GroupVersionKind {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    GroupVersionKind::gvk(group, version, kind)
}

/// The namespace an object of `scope` is written in (none when cluster-scoped).
fn scoped(scope: &Scope, namespace: &str) -> String {
    match scope {
        Scope::Cluster => String::new(),
        Scope::Namespaced => namespace.to_string(),
    }
}
