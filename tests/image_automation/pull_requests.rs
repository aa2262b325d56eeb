//! Image automation by pull request (`ImagePolicy.spec.pullRequest`) on a real Gitea over
//! HTTPS: a new tag opens one pull request and leaves the followed branch alone; a `kill -9`
//! and a human push while it is open make no second branch or pull request; a newer tag
//! replaces it; a person's merge starts the canary; `autoMerge` (allowed by the agent) merges
//! by itself.

use std::time::Duration;

use kube::Api;
use linnet::api::CanaryDeployment;

use super::support::agent::{Agent, start_agent, wait_ready};
use super::support::gitea::{ADMIN, Gitea};
use super::support::registry::{push_image, semver_policy};
use super::support::{self, git};
use super::{Setup, canary_of, setup, write_web_and_policy};

const REPO: &str = "images";

/// The agent on Gitea's repository: image automation scanning every second, pull requests
/// on Gitea with the admin's token, and auto-merge allowed.
fn start_on_gitea(dir: &std::path::Path, gitea: &Gitea, ns: &str, ca: &std::path::Path) -> Agent {
    let token_file = dir.join("gitea-token");
    std::fs::write(&token_file, &gitea.token).unwrap();
    let flags = vec![
        format!("--repo-url={}", gitea.clone_url(REPO)),
        format!("--git-username={ADMIN}"),
        format!("--git-password-file={}", token_file.display()),
        "--commit-status-provider=gitea".into(),
        format!("--commit-status-api-url={}/api/v1", gitea.base),
        format!("--commit-status-repo={ADMIN}/{REPO}"),
        format!("--commit-status-token-file={}", token_file.display()),
        format!("--ca-file={}", ca.display()),
        "--poll-interval=1s".into(),
        "--image-automation=true".into(),
        "--image-scan-interval=1s".into(),
        "--image-automation-auto-merge=true".into(),
        "--writeback=false".into(),
    ];
    start_agent(dir, &flags, ns)
}

/// linnet's open image pull requests: (number, branch, title).
async fn image_pull_requests(gitea: &Gitea) -> Vec<(i64, String, String)> {
    gitea
        .open_pull_requests(REPO)
        .await
        .iter()
        .filter_map(|pr| {
            let branch = pr.pointer("/head/ref")?.as_str()?;
            branch.starts_with("linnet/images/main/").then(|| {
                (
                    pr["number"].as_i64().unwrap_or(0),
                    branch.to_string(),
                    pr["title"].as_str().unwrap_or_default().to_string(),
                )
            })
        })
        .collect()
}

/// The branches on Gitea that linnet's image automation pushed.
async fn image_branches(gitea: &Gitea) -> Vec<String> {
    let v = gitea
        .ok(
            reqwest::Method::GET,
            &format!("/repos/{ADMIN}/{REPO}/branches?limit=50"),
            None,
        )
        .await;
    v.as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|b| b["name"].as_str().map(str::to_string))
        .filter(|b| b.starts_with("linnet/images/"))
        .collect()
}

/// The marked image on Gitea's main.
async fn image_on_main(gitea: &Gitea) -> String {
    let text = gitea
        .raw_file(REPO, "main", "apps/web.yaml")
        .await
        .unwrap_or_default();
    let line = text
        .lines()
        .find(|l| l.contains("$imagepolicy"))
        .unwrap_or_default();
    line.trim()
        .trim_start_matches("image: ")
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Waits for exactly one open image pull request whose title names `image`.
async fn one_pull_request_for(gitea: &Gitea, image: &str) -> (i64, String) {
    support::eventually(
        &format!("one image pull request for {image}"),
        Duration::from_secs(45),
        || async {
            let open = image_pull_requests(gitea).await;
            match open.as_slice() {
                [(n, branch, title)] if title.contains(image) => Some((*n, branch.clone())),
                _ => None,
            }
        },
    )
    .await
}

/// The agent's log lines about pull requests.
fn pull_request_lines(agent: &Agent) -> String {
    agent
        .log_text()
        .lines()
        .filter(|l| l.contains("pull request") || l.contains("image automation"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn push_main(work: &std::path::Path, message: &str) {
    git(work, &["add", "-A"]);
    git(work, &["commit", "-qm", message]);
    git(work, &["pull", "-q", "--rebase", "origin", "main"]);
    git(work, &["push", "-q", "origin", "HEAD:main"]);
}

#[tokio::test]
async fn a_new_tag_opens_one_pull_request_that_survives_a_kill_9_and_merging_it_canaries_it() {
    let Setup {
        client,
        ns,
        tmp,
        tools,
        ca,
        ca_file,
        repository,
        ..
    } = &setup("images-pr", false).await;
    let first = format!("{repository}:1.0.0");
    push_image(tools, tmp.path(), &first, "1.0.0");
    let gitea_dir = tmp.path().join("gitea");
    std::fs::create_dir_all(&gitea_dir).unwrap();
    let gitea = Gitea::start(&gitea_dir, ca).await;
    gitea.create_repo(REPO).await;
    let work = tmp.path().join("work");
    let by_pull_request = format!("{}  pullRequest: {{}}\n", semver_policy(repository));
    write_web_and_policy(&work, &ns.name, &first, &by_pull_request);
    git(&work, &["init", "-q", "-b", "main"]);
    git(
        &work,
        &["config", "http.sslCAInfo", ca_file.to_str().unwrap()],
    );
    git(
        &work,
        &["remote", "add", "origin", &gitea.authed_clone_url(REPO)],
    );
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-qm", "web, by pull request"]);
    git(&work, &["push", "-q", "origin", "HEAD:main"]);

    let agent_dir = tmp.path().join("agent");
    std::fs::create_dir_all(&agent_dir).unwrap();
    let mut agent = start_on_gitea(&agent_dir, &gitea, &ns.name, ca_file);
    wait_ready(&agent).await;
    let api: Api<CanaryDeployment> = Api::namespaced(client.clone(), &ns.name);
    support::eventually("web stable on 1.0.0", Duration::from_secs(90), || {
        let (api, first) = (api.clone(), first.clone());
        async move { (canary_of(&api).await.1 == first).then_some(()) }
    })
    .await;

    // A new tag: one pull request, and main left alone.
    let second = format!("{repository}:1.1.0");
    let digest = push_image(tools, tmp.path(), &second, "1.1.0");
    let (number, branch) = one_pull_request_for(&gitea, &second).await;
    assert_eq!(image_on_main(&gitea).await, first, "main was written");
    let proposed = gitea
        .raw_file(REPO, &branch, "apps/web.yaml")
        .await
        .unwrap();
    assert!(
        proposed.contains(&format!("image: {second} #")),
        "{proposed}"
    );
    let pr = gitea.pull_request(REPO, number).await;
    let body = pr["body"].as_str().unwrap_or_default();
    assert!(
        body.contains(&digest),
        "the pull request names the digest: {body}"
    );
    assert!(
        body.contains("ImagePolicy web (policies/web.yaml)"),
        "{body}"
    );

    // A kill -9, a human push to main, and a restart: the same pull request, no new branch.
    agent.kill();
    std::fs::write(work.join("apps/notes.yaml"), "note: a human was here\n").unwrap();
    push_main(&work, "a human's change");
    let mut agent = start_on_gitea(&agent_dir, &gitea, &ns.name, ca_file);
    wait_ready(&agent).await;
    support::let_time_pass("five scans after the restart", Duration::from_secs(5)).await;
    assert_eq!(
        image_pull_requests(&gitea).await,
        vec![(number, branch.clone(), format!("Update images: {second}"))]
    );
    assert_eq!(image_branches(&gitea).await, vec![branch.clone()]);
    assert_eq!(
        canary_of(&api).await.1,
        first,
        "nothing canaried before a merge"
    );

    // A newer tag replaces it: a new pull request, the old one closed.
    let third = format!("{repository}:1.2.0");
    push_image(tools, tmp.path(), &third, "1.2.0");
    let (newer, newer_branch) = one_pull_request_for(&gitea, &third).await;
    assert_ne!(newer, number);
    assert_ne!(newer_branch, branch);

    // A person merges it: main has 1.2.0, and the rollout canaries it.
    gitea
        .merge_open_pull_request(REPO, newer, "Merge the image update")
        .await;
    support::eventually("web on 1.2.0", Duration::from_secs(90), || {
        let (api, third) = (api.clone(), third.clone());
        async move {
            let (canary, stable) = canary_of(&api).await;
            (canary == third || stable == third).then_some(())
        }
    })
    .await;
    support::let_time_pass("three scans after the merge", Duration::from_secs(3)).await;
    let open = image_pull_requests(&gitea).await;
    assert!(
        open.is_empty(),
        "{open:?} reopened; the agent said:\n{}",
        pull_request_lines(&agent)
    );

    // autoMerge, allowed by the agent: the next tag is merged with no person.
    git(&work, &["pull", "-q", "--rebase", "origin", "main"]);
    let auto = format!(
        "{}  pullRequest:\n    autoMerge: true\n",
        semver_policy(repository)
    );
    std::fs::write(work.join("policies/web.yaml"), auto).unwrap();
    push_main(&work, "web's image pull requests merge themselves");
    let fourth = format!("{repository}:1.3.0");
    push_image(tools, tmp.path(), &fourth, "1.3.0");
    support::eventually("1.3.0 merged to main", Duration::from_secs(45), || async {
        (image_on_main(&gitea).await == fourth).then_some(())
    })
    .await;
    // Gitea marks a merged pull request closed a moment after main has the merge.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut closed = false;
    while !closed && std::time::Instant::now() < deadline {
        closed = image_pull_requests(&gitea).await.is_empty();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        closed,
        "{:?} open after the merge; the agent said:\n{}",
        image_pull_requests(&gitea).await,
        pull_request_lines(&agent)
    );
    support::eventually(
        "web on 1.3.0, linked to its policy",
        Duration::from_secs(90),
        || {
            let (api, fourth) = (api.clone(), fourth.clone());
            async move {
                let status = api.get("web").await.ok()?.status?;
                let on_it = status.stable_image.as_deref() == Some(fourth.as_str())
                    || status.canary_image.as_deref() == Some(fourth.as_str());
                let source = status.image_source.unwrap_or_default();
                (on_it && source.starts_with(&format!("{fourth} ("))).then_some(())
            }
        },
    )
    .await;
    assert!(
        agent
            .log_text()
            .contains("image automation merged its pull request"),
        "{}",
        agent.log_text()
    );
    agent.kill();
}
