//! A rollout under test: its own namespace, a spec directory that the agent binary follows
//! (`--repo-path`, the same sync Git uses), and helpers to edit the spec as a merged commit
//! would and to wait for the rollout's phase.

use std::path::PathBuf;
use std::time::Duration;

use kube::api::ListParams;
use kube::{Api, Client};
use serde_json::{Value, json};

use super::agent::{Agent, start_agent_with, wait_ready};
use super::{TestNamespace, admin_client, eventually, install_linnet};

pub struct Fixture {
    // Fields drop in order: the agent (printing its log on failure) before its directory.
    pub agent: Option<Agent>,
    pub admin: Client,
    pub ns: TestNamespace,
    pub dir: tempfile::TempDir,
    /// The object in the spec file.
    pub spec: Value,
    /// The identity the agent runs as (user `linnet` unless started with [`Fixture::start_as`]).
    pub kubeconfig: PathBuf,
}

/// Merges `patch` into `base`, objects key by key.
pub fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, p) => *b = p,
    }
}

/// A CanaryDeployment `web` in `ns` (4 replicas of nginx:1.27 in two batches, paused after the
/// first) with `patch` merged into its spec.
pub fn batched_web(ns: &str, patch: Value) -> Value {
    let mut spec = json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1",
        "kind": "CanaryDeployment",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "replicas": 4,
            "image": "nginx:1.27",
            "strategy": {"type": "Batches"},
            "batches": 2,
            "pause": "First",
            "currentBatch": 1,
            "progressDeadlineSeconds": 60,
            "template": {
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}
                }
            }
        }
    });
    merge(&mut spec["spec"], patch);
    spec
}

/// A CanaryStatefulSet `redis` in `ns` (2 replicas, 1 canary, redis:7.2, no volumes) with
/// `patch` merged into its spec: the smallest rollout a test of an output can drive.
pub fn small_redis(ns: &str, patch: Value) -> Value {
    let mut spec = json!({
        "apiVersion": "rollouts.linnet.dev/v1alpha1",
        "kind": "CanaryStatefulSet",
        "metadata": {"name": "redis", "namespace": ns},
        "spec": {
            "replicas": 2,
            "canaryReplicas": 1,
            "image": "redis:7.2",
            "template": {
                "serviceName": "redis",
                "selector": {"matchLabels": {"app": "redis"}},
                "template": {
                    "metadata": {"labels": {"app": "redis"}},
                    "spec": {"containers": [{"name": "redis", "image": "redis:7.2"}]}
                }
            }
        }
    });
    merge(&mut spec["spec"], patch);
    spec
}

impl Fixture {
    /// A namespace `t-<prefix>-…`, the spec `make(namespace)` in it, and an agent following it.
    pub async fn start(prefix: &str, make: impl FnOnce(&str) -> Value) -> Fixture {
        Fixture::start_as(prefix, make, super::linnet_kubeconfig()).await
    }

    /// [`Fixture::start`] with the agent running as the identity of `kubeconfig`.
    pub async fn start_as(
        prefix: &str,
        make: impl FnOnce(&str) -> Value,
        kubeconfig: PathBuf,
    ) -> Fixture {
        let mut f = Fixture::prepare_as(prefix, make, kubeconfig).await;
        f.start_agent().await;
        f
    }

    /// [`Fixture::start`] without the agent: the spec is written, nothing follows it yet.
    pub async fn prepare(prefix: &str, make: impl FnOnce(&str) -> Value) -> Fixture {
        Fixture::prepare_as(prefix, make, super::linnet_kubeconfig()).await
    }

    async fn prepare_as(
        prefix: &str,
        make: impl FnOnce(&str) -> Value,
        kubeconfig: PathBuf,
    ) -> Fixture {
        let admin = admin_client().await;
        install_linnet(&admin).await;
        let ns = TestNamespace::create(&admin, prefix).await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("specs")).unwrap();
        let f = Fixture {
            spec: make(&ns.name),
            admin,
            ns,
            dir,
            agent: None,
            kubeconfig,
        };
        f.write();
        f
    }

    /// Every distinct status (`status_of`) the objects of kind `K` in this namespace show,
    /// in order, from a watch opened now.
    pub fn record_statuses<K, S>(
        &self,
        status_of: fn(K) -> Option<S>,
    ) -> std::sync::Arc<std::sync::Mutex<Vec<S>>>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
        <K as kube::Resource>::DynamicType: Default,
        S: PartialEq + Send + 'static,
    {
        use futures::StreamExt;
        use kube::runtime::watcher::{Config, Event, watcher};
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let out = seen.clone();
        let api = self.api::<K>();
        tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, Config::default()));
            while let Some(Ok(event)) = events.next().await {
                if let Event::Apply(r) | Event::InitApply(r) = event
                    && let Some(status) = status_of(r)
                {
                    let mut seen = out.lock().unwrap();
                    if seen.last() != Some(&status) {
                        seen.push(status);
                    }
                }
            }
        });
        seen
    }

    /// The reasons of the events about the object of kind `kind` in this namespace.
    pub async fn event_reasons_of(&self, kind: &str) -> Vec<String> {
        self.api::<k8s_openapi::api::events::v1::Event>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some(kind))
            .filter_map(|e| e.reason)
            .collect()
    }

    pub async fn start_agent(&mut self) {
        self.start_agent_with(&[]).await;
    }

    /// [`Fixture::start_agent`] with `args` added.
    pub async fn start_agent_with(&mut self, args: &[String]) {
        let agent = self.spawn_agent("agent", args);
        wait_ready(&agent).await;
        self.agent = Some(agent);
    }

    /// Fails the test if the agent put back anything as changed outside Git: no test changes
    /// an object by hand unless it says so, so a revert is one of linnet's writers undoing
    /// another's.
    pub fn assert_no_drift_reverted(&self) {
        let log = self.agent.as_ref().map(Agent::log_text).unwrap_or_default();
        assert!(
            !log.contains("reverted changes made outside Git"),
            "the agent reverted drift:\n{log}"
        );
    }

    /// Another agent process on the same specs, logging to `<name>.log`, with `args` added.
    pub fn spawn_agent(&self, name: &str, args: &[String]) -> Agent {
        let dir = self.dir.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let mut all = vec![format!(
            "--repo-path={}",
            self.dir.path().join("specs").display()
        )];
        all.extend_from_slice(args);
        start_agent_with(&dir, &all, &self.ns.name, &self.kubeconfig)
    }

    /// Kills the agent like `kill -9`; its log stays in the directory.
    pub fn kill_agent(&mut self) {
        if let Some(mut a) = self.agent.take() {
            a.kill();
            std::mem::forget(a);
        }
    }

    /// Writes the spec file, as a Git sync would see it (JSON is YAML).
    pub fn write(&self) {
        std::fs::write(
            self.spec_file(),
            serde_json::to_string_pretty(&self.spec).unwrap(),
        )
        .unwrap();
    }

    /// Writes another spec file (e.g. the AnalysisTemplates the rollout references).
    pub fn write_file(&self, name: &str, docs: &[Value]) {
        let text: Vec<String> = docs
            .iter()
            .map(|d| serde_json::to_string_pretty(d).unwrap())
            .collect();
        std::fs::write(
            self.dir.path().join("specs").join(name),
            text.join("\n---\n"),
        )
        .unwrap();
    }

    fn spec_file(&self) -> PathBuf {
        self.dir.path().join("specs/rollout.yaml")
    }

    /// Changes the spec by a merge patch of its `spec`, and writes it.
    pub fn patch_spec(&mut self, patch: Value) {
        merge(&mut self.spec["spec"], patch);
        self.write();
    }

    pub fn annotate(&mut self, key: &str, value: &str) {
        merge(
            &mut self.spec["metadata"],
            json!({"annotations": {key: value}}),
        );
        self.write();
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.admin.clone(), &self.ns.name)
    }

    /// Replicas asked for per image, over the Deployments in this namespace.
    pub async fn deployment_replicas_by_image(&self) -> std::collections::BTreeMap<String, i32> {
        let mut out = std::collections::BTreeMap::new();
        for d in self
            .api::<k8s_openapi::api::apps::v1::Deployment>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
        {
            let spec = d.spec.unwrap();
            let image = spec.template.spec.unwrap().containers[0]
                .image
                .clone()
                .unwrap();
            *out.entry(image).or_insert(0) += spec.replicas.unwrap_or(0);
        }
        out
    }

    /// Waits until the rollout `name` of kind `K` satisfies `done`.
    pub async fn wait_for<K>(&self, what: &str, secs: u64, done: impl Fn(&K) -> bool) -> K
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        <K as kube::Resource>::DynamicType: Default,
    {
        let name = self.spec["metadata"]["name"].as_str().unwrap().to_string();
        let api = self.api::<K>();
        eventually(
            &format!("{what} in {}", self.ns.name),
            Duration::from_secs(secs),
            || async { api.get_opt(&name).await.unwrap().filter(|o| done(o)) },
        )
        .await
    }

    /// Checks that the rollout of kind `K` satisfies `ok` through `secs` seconds: what must not
    /// change (see [`super::holds_for`]).
    pub async fn holds<K>(&self, what: &str, secs: u64, ok: impl Fn(&K) -> bool)
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        <K as kube::Resource>::DynamicType: Default,
    {
        let name = self.spec["metadata"]["name"].as_str().unwrap().to_string();
        let api = self.api::<K>();
        super::holds_for(
            &format!("{what} in {}", self.ns.name),
            Duration::from_secs(secs),
            || async {
                match api.get_opt(&name).await.unwrap() {
                    Some(o) if ok(&o) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await
    }

    /// Waits until every reason of `wanted` has an event: a reconcile publishes its events
    /// after the status and the actions a test waits for.
    pub async fn wait_event_reasons(&self, wanted: &[&str], secs: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            let reasons = self.event_reasons().await;
            let missing: Vec<&&str> = wanted
                .iter()
                .filter(|r| !reasons.iter().any(|x| x == *r))
                .collect();
            if missing.is_empty() {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no {missing:?} event in {reasons:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    pub async fn event_reasons(&self) -> Vec<String> {
        self.api::<k8s_openapi::api::events::v1::Event>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|e| e.reason)
            .collect()
    }
}
