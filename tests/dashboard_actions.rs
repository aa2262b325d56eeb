//! Issue 76's actions: a person signs in to the dashboard with a Kubernetes token (checked by
//! the real API server's TokenReview), and a click on Promote becomes a pull request on a real
//! Gitea, authored as them, whose diff is exactly the promote annotation; merging it promotes.
//! Refused: no session (401), a token the cluster does not know (401), a person without
//! `patch` on the rollout (403, SubjectAccessReview), a request without the session's CSRF
//! token or from another origin (403). Every action is an event on the rollout. With
//! `--dashboard-merge`, a person who may also `merge` the rollout gets the pull request merged
//! at once: a CanaryDeployment's next batch, its diff exactly `currentBatch`.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Api;
use kube::api::PostParams;
use linnet::api::{CanaryDeployment, CanaryStatefulSet, DeploymentPhase, StatefulSetPhase};
use serde_json::{Value, json};
use support::agent::{SECRET, start_agent, wait_ready};
use support::browser::Browser;
use support::gitea::{
    ADMIN, EXAMPLE_REPO as REPO, Gitea, agent_args, set_redis_images, with_example,
};
use support::ports::free_port;
use support::{TestNamespace, admin_client, eventually, git, install_linnet};

/// A ServiceAccount `name` in `ns` that may do `verbs` on `resource` there, and a
/// token for it from the API server (TokenRequest).
async fn person(
    admin: &kube::Client,
    ns: &str,
    name: &str,
    (resource, verbs): (&str, &[&str]),
) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    let pp = PostParams::default();
    let account = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    accounts.create(&pp, &account).await.unwrap();
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": name},
        "rules": [{"apiGroups": ["rollouts.linnet.dev"], "resources": [resource], "verbs": verbs}],
    }))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), ns)
        .create(&pp, &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .create(&pp, &binding)
        .await
        .unwrap();
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = accounts
        .create_token_request(name, &pp, &request)
        .await
        .unwrap();
    token.status.unwrap().token.unwrap()
}

/// A dashboard client that keeps its session cookie, as a browser would (without one).
struct Visitor {
    http: reqwest::Client,
    base: String,
    cookie: Option<String>,
    csrf: Option<String>,
}

impl Visitor {
    fn new(base: &str) -> Visitor {
        Visitor {
            http: reqwest::Client::new(),
            base: base.to_string(),
            cookie: None,
            csrf: None,
        }
    }

    /// Signs in with `token`: the status.
    async fn sign_in(&mut self, token: &str) -> u16 {
        let resp = self
            .http
            .post(format!("{}/api/session", self.base))
            .json(&json!({"token": token}))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        if let Some(c) = resp.headers().get("set-cookie") {
            let c = c.to_str().unwrap();
            for part in ["HttpOnly", "Secure", "SameSite=Strict"] {
                assert!(c.contains(part), "{c}");
            }
            self.cookie = Some(c.split(';').next().unwrap().to_string());
        }
        let body: Value = resp.json().await.unwrap_or_default();
        self.csrf = body["csrf"].as_str().map(str::to_string);
        status
    }

    /// Clicks `action` on `rollout` (`csts/<ns>/<name>`): the status and the answer.
    async fn act(
        &self,
        rollout: &str,
        action: &str,
        origin: Option<&str>,
        csrf: bool,
    ) -> (u16, Value) {
        let url = format!("{}/api/rollouts/{rollout}/actions/{action}", self.base);
        let mut req = self.http.post(url);
        if let Some(c) = &self.cookie {
            req = req.header("cookie", c);
        }
        if let (true, Some(t)) = (csrf, &self.csrf) {
            req = req.header("x-linnet-csrf", t);
        }
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or_default())
    }
}

/// linnet's open action pull requests: (number, branch).
async fn action_pull_requests(gitea: &Gitea) -> Vec<(i64, String)> {
    gitea
        .open_pull_requests(REPO)
        .await
        .iter()
        .filter_map(|p| {
            let branch = p["head"]["ref"].as_str()?;
            branch
                .starts_with("linnet/action/")
                .then(|| (p["number"].as_i64().unwrap(), branch.to_string()))
        })
        .collect()
}

/// The lines a unified diff adds and removes.
fn changed_lines(diff: &str) -> Vec<&str> {
    diff.lines()
        .filter(|l| {
            (l.starts_with('+') || l.starts_with('-'))
                && !l.starts_with("+++")
                && !l.starts_with("---")
        })
        .collect()
}

#[tokio::test]
async fn a_signed_in_person_with_rights_promotes_by_a_pull_request_and_others_are_refused() {
    let admin = admin_client().await;
    install_linnet(&admin).await;
    let ns = TestNamespace::create(&admin, "dash-actions").await;
    let tmp = tempfile::tempdir().unwrap();
    let (gitea, ca_file, work) = with_example(tmp.path(), &ns.name).await;
    let port = free_port();
    let mut args = agent_args(tmp.path(), &gitea, &ca_file);
    args.extend([
        format!("--dashboard-listen=127.0.0.1:{port}"),
        "--dashboard-actions".into(),
        "--dashboard-merge".into(),
    ]);
    let agent = start_agent(tmp.path(), &args, &ns.name);
    wait_ready(&agent).await;
    gitea
        .add_push_hook(REPO, &format!("{}/hooks/gitea", agent.hooks), SECRET)
        .await;
    let redis: Api<CanaryStatefulSet> = Api::namespaced(admin.clone(), &ns.name);
    let phase_is = |want: StatefulSetPhase, image: &'static str| {
        let redis = redis.clone();
        move || {
            let redis = redis.clone();
            async move {
                let o = redis.get("redis").await.ok()?;
                let st = o.status.as_ref()?;
                (st.phase == Some(want) && o.spec.image == image).then_some(o)
            }
        }
    };
    eventually(
        "redis Stable on 7.2",
        Duration::from_secs(120),
        phase_is(StatefulSetPhase::Stable, "redis:7.2"),
    )
    .await;
    let web: Api<CanaryDeployment> = Api::namespaced(admin.clone(), &ns.name);
    web_in(&web, DeploymentPhase::Completed, "nginx:1.27").await;
    set_redis_images(&work, "redis:7.2", "redis:7.4");
    for _ in 0..2 {
        support::edit_file(
            &work,
            "apps/web/web.yaml",
            "image: nginx:1.27\n",
            "image: nginx:1.28\n",
        );
    }
    git(&work, &["commit", "-qam", "redis 7.4, web 1.28"]);
    git(&work, &["push", "-q", "origin", "HEAD:main"]);
    eventually(
        "redis's canary waiting for its promotion",
        Duration::from_secs(120),
        || {
            let redis = redis.clone();
            async move {
                let o = redis.get("redis").await.ok()?;
                let m = o.status.as_ref()?.message.clone()?;
                m.contains("waiting for promotion").then_some(())
            }
        },
    )
    .await;

    let sets = "canarystatefulsets";
    let alice = person(&admin, &ns.name, "alice", (sets, &["get", "patch"])).await;
    let bob = person(&admin, &ns.name, "bob", (sets, &["get"])).await;
    let base = format!("http://127.0.0.1:{port}");
    let redis_page = format!("csts/{}/redis", ns.name);

    // Refused: no session, a token the cluster does not know, no right to patch.
    let mut nobody = Visitor::new(&base);
    assert_eq!(nobody.act(&redis_page, "promote", None, true).await.0, 401);
    assert_eq!(nobody.sign_in("not-a-token").await, 401);
    assert_eq!(nobody.sign_in(&"x".repeat(20 * 1024)).await, 413);
    assert_eq!(nobody.act(&redis_page, "promote", None, true).await.0, 401);
    let mut bob_visits = Visitor::new(&base);
    assert_eq!(bob_visits.sign_in(&bob).await, 200);
    let (status, body) = bob_visits.act(&redis_page, "promote", None, true).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("may not patch"),
        "{body}"
    );
    // Refused: alice's session without its CSRF token, or from another site.
    let mut alice_visits = Visitor::new(&base);
    assert_eq!(alice_visits.sign_in(&alice).await, 200);
    assert_eq!(
        alice_visits
            .act(&redis_page, "promote", None, false)
            .await
            .0,
        403
    );
    let evil = Some("https://evil.example");
    assert_eq!(
        alice_visits.act(&redis_page, "promote", evil, true).await.0,
        403
    );
    // Not a CanaryStatefulSet's action: said why.
    let (status, body) = alice_visits.act(&redis_page, "advance", None, true).await;
    assert_eq!(status, 409, "{body}");
    assert!(action_pull_requests(&gitea).await.is_empty());
    // Abort, by the same route: its pull request sets the abort annotation alone. Closed
    // here, to promote instead.
    let (status, abort) = alice_visits.act(&redis_page, "abort", None, true).await;
    assert_eq!(
        (status, abort["state"].as_str()),
        (200, Some("opened")),
        "{abort}"
    );
    let url = abort["pullRequest"].as_str().unwrap();
    let number = url.rsplit('/').next().unwrap();
    assert_eq!(
        changed_lines(&gitea.pull_request_diff(REPO, number).await),
        vec![
            "+  annotations:",
            "+    rollouts.linnet.dev/abort: \"true\""
        ]
    );
    let close = format!("/repos/{ADMIN}/{REPO}/pulls/{number}");
    let closed = Some(json!({"state": "closed"}));
    gitea.ok(reqwest::Method::PATCH, &close, closed).await;
    assert!(action_pull_requests(&gitea).await.is_empty());

    // In the browser: alice signs in with her token and clicks Promote.
    let mut browser = Browser::start().await;
    browser
        .open(&format!("{base}/#/csts/{}/redis", ns.name))
        .await;
    browser.wait_text(&["Promote", "Sign in"], 30).await;
    let sign_in = format!(
        "document.getElementById('token').value = {}; document.getElementById('sign-in').requestSubmit(); 'ok'",
        Value::String(alice.clone())
    );
    browser.eval(&sign_in).await;
    browser
        .wait_text(&["Signed in as system:serviceaccount:"], 30)
        .await;
    browser
        .eval("document.querySelector('button[data-action=\"promote\"]').click(); 'ok'")
        .await;
    browser
        .wait_text(&["Opened", "merge it to promote"], 60)
        .await;
    let pr_url = browser
        .eval("document.getElementById('action-pr').href")
        .await;
    std::fs::create_dir_all(support::screenshots_dir()).unwrap();
    browser
        .screenshot(&support::screenshots_dir().join("dashboard-actions.png"))
        .await;

    // One pull request, authored as alice, whose diff is exactly the annotation.
    let prs = action_pull_requests(&gitea).await;
    assert_eq!(prs.len(), 1, "{prs:?}");
    let (number, branch) = prs[0].clone();
    assert!(
        branch.starts_with(&format!("linnet/action/{}/redis/promote-", ns.name)),
        "{branch}"
    );
    assert!(
        pr_url
            .as_str()
            .unwrap()
            .ends_with(&format!("/pulls/{number}")),
        "{pr_url}"
    );
    let diff = gitea.pull_request_diff(REPO, number).await;
    assert_eq!(
        changed_lines(&diff),
        vec![
            "+  annotations:",
            "+    rollouts.linnet.dev/promote: \"true\""
        ],
        "{diff}"
    );
    let pr = gitea.pull_request(REPO, number).await;
    let sha = pr["head"]["sha"].as_str().unwrap();
    let commit = gitea
        .ok(
            reqwest::Method::GET,
            &format!("/repos/{ADMIN}/{REPO}/git/commits/{sha}"),
            None,
        )
        .await;
    let who = format!("system:serviceaccount:{}:alice", ns.name);
    assert_eq!(commit["commit"]["author"]["name"], who.as_str(), "{commit}");
    // A second click finds the same pull request.
    let (status, again) = alice_visits.act(&redis_page, "promote", None, true).await;
    assert_eq!(
        (status, again["state"].as_str()),
        (200, Some("found")),
        "{again}"
    );
    assert_eq!(action_pull_requests(&gitea).await.len(), 1);
    // Audited: an event on the rollout names alice and the pull request.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin.clone(), &ns.name);
    let noted = eventually("a DashboardAction event", Duration::from_secs(30), || {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            list.items.into_iter().find_map(|e| {
                let note = e.note.filter(|n| n.contains("asked to promote"))?;
                (e.reason.as_deref() == Some("DashboardAction")).then_some(note)
            })
        }
    })
    .await;
    let note = noted;
    assert!(
        note.contains(&who) && note.contains(&format!("/pulls/{number}")),
        "{note}"
    );

    // Merging it promotes.
    gitea
        .merge_open_pull_request(REPO, number, "Promote redis")
        .await;
    eventually(
        "redis Stable on 7.4",
        Duration::from_secs(120),
        phase_is(StatefulSetPhase::Stable, "redis:7.4"),
    )
    .await;
    let (status, body) = alice_visits.act(&redis_page, "promote", None, true).await;
    assert_eq!(status, 409, "{body}");

    // With --dashboard-merge, a person who may also `merge` the rollout gets the pull request
    // merged at once (alice, without that right, got hers opened): carol starts web's second
    // batch, and web finishes on nginx:1.28.
    web_in(&web, DeploymentPhase::Paused, "nginx:1.28").await;
    let deployments = "canarydeployments";
    let carol = person(
        &admin,
        &ns.name,
        "carol",
        (deployments, &["patch", "merge"]),
    )
    .await;
    let mut carol_visits = Visitor::new(&base);
    assert_eq!(carol_visits.sign_in(&carol).await, 200);
    let web_page = format!("cdeploy/{}/web", ns.name);
    let (status, body) = carol_visits.act(&web_page, "promote", None, true).await;
    assert_eq!(status, 409, "{body}");
    let (status, merged) = carol_visits.act(&web_page, "advance", None, true).await;
    assert_eq!(
        (status, merged["state"].as_str()),
        (200, Some("merged")),
        "{merged}"
    );
    let url = merged["pullRequest"].as_str().unwrap();
    let number = url.rsplit('/').next().unwrap();
    let diff = gitea.pull_request_diff(REPO, number).await;
    assert_eq!(
        changed_lines(&diff),
        vec!["-  currentBatch: 1", "+  currentBatch: 2"],
        "{diff}"
    );
    web_in(&web, DeploymentPhase::Completed, "nginx:1.28").await;
}

/// Waits for web in `phase` on `image`.
async fn web_in(web: &Api<CanaryDeployment>, phase: DeploymentPhase, image: &str) {
    let what = format!("web {phase:?} on {image}");
    eventually(&what, Duration::from_secs(120), || async {
        let o = web.get("web").await.ok()?;
        let st = o.status.as_ref()?;
        (st.phase == Some(phase) && o.spec.image == image).then_some(())
    })
    .await;
}
