//! A real Gitea for the end-to-end tests: built from its Go module by `tests/gitea/build.sh`
//! (cached outside the checkout), started on 127.0.0.1 with SQLite in a scratch directory,
//! serving HTTPS with a certificate from the test's own CA (as a self-hosted Gitea behind a
//! private CA does), an admin user and an API token, and a small client for the parts of its
//! API the tests use.
//! Killed when dropped; its log is printed when a test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::git;

pub const ADMIN: &str = "linnet-admin";
/// The repository [`with_example`] makes.
pub const EXAMPLE_REPO: &str = "gitops";
const PASSWORD: &str = "linnet-admin-password";

/// Where the built Gitea lives: `LINNET_GITEA_HOME`, or what `tests/gitea/build.sh` prints
/// (instant when cached; builds once per machine otherwise).
pub fn gitea_home() -> PathBuf {
    static HOME: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut home = HOME.lock().unwrap();
    if let Some(h) = home.as_ref() {
        return h.clone();
    }
    let found = match std::env::var_os("LINNET_GITEA_HOME") {
        Some(h) => PathBuf::from(h),
        None => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gitea/build.sh");
            let out = Command::new("bash")
                .arg(&script)
                .stderr(Stdio::inherit())
                .output()
                .expect("run tests/gitea/build.sh");
            assert!(out.status.success(), "tests/gitea/build.sh failed");
            let text = String::from_utf8_lossy(&out.stdout);
            PathBuf::from(
                text.lines()
                    .last()
                    .expect("build.sh prints the directory")
                    .trim(),
            )
        }
    };
    assert!(
        found.join("bin/gitea").is_file(),
        "no Gitea binary in {}",
        found.display()
    );
    *home = Some(found.clone());
    found
}

/// A running Gitea; killed when dropped.
pub struct Gitea {
    child: Child,
    dir: PathBuf,
    /// e.g. `https://127.0.0.1:3456`
    pub base: String,
    /// An admin API token with every scope.
    pub token: String,
    http: reqwest::Client,
}

impl Drop for Gitea {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.join("log/gitea.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(80).collect();
            eprintln!("---- gitea log (last 80 lines)");
            for l in tail.into_iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

fn gitea_command(home: &Path, dir: &Path) -> Command {
    let mut c = Command::new(home.join("bin/gitea"));
    c.args(["--config", dir.join("app.ini").to_str().unwrap()])
        .args(["--work-path", dir.to_str().unwrap()])
        .env("GITEA_WORK_DIR", dir)
        .env("HOME", dir.join("home"))
        .env_remove("GIT_DIR");
    c
}

fn run_ok(mut c: Command, what: &str) -> String {
    let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The current user's name; Gitea insists that `RUN_USER` is the user it runs as.
fn current_user() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl Gitea {
    /// Writes `app.ini` and a server certificate signed by `ca`, migrates the database,
    /// creates the admin user and its token, starts `gitea web` over HTTPS and waits until its
    /// API answers.
    pub async fn start(dir: &Path, ca: &super::tls::TestCa) -> Gitea {
        let home = gitea_home();
        let port = super::ports::free_port();
        std::fs::create_dir_all(dir.join("home")).unwrap();
        let server = ca.server_cert();
        std::fs::write(dir.join("cert.pem"), &server.cert_pem).unwrap();
        std::fs::write(dir.join("key.pem"), &server.key_pem).unwrap();
        let base = format!("https://127.0.0.1:{port}");
        let d = dir.display();
        let ini = format!(
            r#"APP_NAME = linnet-test
RUN_USER = {user}
RUN_MODE = prod
WORK_PATH = {d}
; The tests run as root on CI machines.
I_AM_BEING_UNSAFE_RUNNING_AS_ROOT = true

[server]
PROTOCOL = https
CERT_FILE = {d}/cert.pem
KEY_FILE = {d}/key.pem
HTTP_ADDR = 127.0.0.1
HTTP_PORT = {port}
ROOT_URL = {base}/
DISABLE_SSH = true
START_SSH_SERVER = false
OFFLINE_MODE = true
LFS_START_SERVER = false
APP_DATA_PATH = {d}/data
; templates/ and options/ from the module (no bindata build)
STATIC_ROOT_PATH = {home}

[database]
DB_TYPE = sqlite3
PATH = {d}/data/gitea.db

[repository]
ROOT = {d}/repos
DEFAULT_BRANCH = main

[security]
INSTALL_LOCK = true
SECRET_KEY = linnet-test-secret-key
INTERNAL_TOKEN = eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJuYmYiOjE3MDAwMDAwMDB9.linnet-test-internal-token

[oauth2]
ENABLED = false

[webhook]
; The agent listens on loopback.
ALLOWED_HOST_LIST = loopback
DELIVER_TIMEOUT = 5

[service]
DISABLE_REGISTRATION = true
REQUIRE_SIGNIN_VIEW = false

[mailer]
ENABLED = false

[session]
PROVIDER = memory

[cache]
ADAPTER = memory

[queue]
; In-process queues: webhooks are delivered as soon as they are queued.
TYPE = channel

[indexer]
ISSUE_INDEXER_TYPE = db
REPO_INDEXER_ENABLED = false

[actions]
ENABLED = false

[cron]
ENABLED = false

[cron.update_checker]
ENABLED = false

[log]
MODE = file
LEVEL = Info
ROOT_PATH = {d}/log
"#,
            user = current_user(),
            home = home.display(),
        );
        std::fs::write(dir.join("app.ini"), ini).unwrap();

        let mut migrate = gitea_command(&home, dir);
        migrate.arg("migrate");
        run_ok(migrate, "gitea migrate");
        let mut create = gitea_command(&home, dir);
        create.args([
            "admin",
            "user",
            "create",
            "--admin",
            "--username",
            ADMIN,
            "--password",
            PASSWORD,
            "--email",
            "admin@linnet.invalid",
            "--must-change-password=false",
        ]);
        run_ok(create, "gitea admin user create");
        let mut token = gitea_command(&home, dir);
        token.args([
            "admin",
            "user",
            "generate-access-token",
            "--username",
            ADMIN,
            "--token-name",
            "linnet-tests",
            "--scopes",
            "all",
            "--raw",
        ]);
        // The token is the last line; Gitea logs its root warning to stdout before it.
        let token = run_ok(token, "gitea admin user generate-access-token")
            .lines()
            .last()
            .unwrap_or_default()
            .trim()
            .to_string();
        assert!(
            token.len() == 40 && token.chars().all(|c| c.is_ascii_hexdigit()),
            "not a token: {token:?}"
        );

        let mut web = gitea_command(&home, dir);
        web.args(["web", "--port", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("gitea.stderr")).unwrap());
        let child = web.spawn().expect("start gitea web");
        let gitea = Gitea {
            child,
            dir: dir.to_path_buf(),
            base,
            token,
            http: ca.client(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = gitea.http.get(gitea.api("/version")).send().await
                && r.status() == 200
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "gitea did not answer within 60s: {}",
                std::fs::read_to_string(dir.join("gitea.stderr")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        gitea
    }

    pub fn api(&self, path: &str) -> String {
        format!("{}/api/v1{path}", self.base)
    }

    /// A clone URL with the admin's credentials in it, for `git push` from a test.
    pub fn authed_clone_url(&self, repo: &str) -> String {
        let host = self.base.trim_start_matches("https://");
        format!("https://{ADMIN}:{}@{host}/{ADMIN}/{repo}.git", self.token)
    }

    pub fn clone_url(&self, repo: &str) -> String {
        format!("{}/{ADMIN}/{repo}.git", self.base)
    }

    /// Sends an API request as the admin and returns the status and the JSON body (Null when
    /// there is none).
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, self.api(path))
            .header("authorization", format!("token {}", self.token));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("gitea API request");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Like [`Gitea::call`], asserting a 2xx answer.
    pub async fn ok(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let m = method.to_string();
        let (status, v) = self.call(method, path, body).await;
        assert!((200..300).contains(&status), "{m} {path}: {status} {v}");
        v
    }

    pub async fn create_repo(&self, name: &str) -> Value {
        self.ok(
            reqwest::Method::POST,
            "/user/repos",
            Some(json!({"name": name, "default_branch": "main", "auto_init": false, "private": true})),
        )
        .await
    }

    /// Adds a Gitea-type push webhook with `secret`, aimed at `url`; returns its id.
    pub async fn add_push_hook(&self, repo: &str, url: &str, secret: &str) -> i64 {
        let hook = self
            .ok(
                reqwest::Method::POST,
                &format!("/repos/{ADMIN}/{repo}/hooks"),
                Some(json!({
                    "type": "gitea",
                    "active": true,
                    "events": ["push"],
                    "config": {"url": url, "content_type": "json", "secret": secret},
                })),
            )
            .await;
        hook["id"].as_i64().expect("hook id")
    }

    /// Gives the webhook a new secret; returns its new id. Gitea's edit-hook API leaves the
    /// secret as it was, so the hook is replaced.
    pub async fn replace_hook_secret(&self, repo: &str, id: i64, url: &str, secret: &str) -> i64 {
        self.ok(
            reqwest::Method::DELETE,
            &format!("/repos/{ADMIN}/{repo}/hooks/{id}"),
            None,
        )
        .await;
        self.add_push_hook(repo, url, secret).await
    }

    /// The commit statuses of `sha` (newest first, as Gitea lists them).
    pub async fn statuses(&self, repo: &str, sha: &str) -> Vec<Value> {
        let v = self
            .ok(
                reqwest::Method::GET,
                &format!("/repos/{ADMIN}/{repo}/commits/{sha}/statuses?limit=50"),
                None,
            )
            .await;
        v.as_array().cloned().unwrap_or_default()
    }

    /// A file's text on `git_ref`, if it is there.
    pub async fn raw_file(&self, repo: &str, git_ref: &str, path: &str) -> Option<String> {
        let resp = self
            .http
            .get(self.api(&format!("/repos/{ADMIN}/{repo}/raw/{path}?ref={git_ref}")))
            .header("authorization", format!("token {}", self.token))
            .send()
            .await
            .ok()?;
        if resp.status() != 200 {
            return None;
        }
        resp.text().await.ok()
    }

    /// Opens a pull request from `head` into `base`, merges it (a merge commit), and returns
    /// the merge commit. Gitea checks mergeability in the background, so the merge is retried
    /// while it answers "try again later".
    pub async fn merge_pull_request(
        &self,
        repo: &str,
        head: &str,
        base: &str,
        title: &str,
    ) -> String {
        let pr = self
            .ok(
                reqwest::Method::POST,
                &format!("/repos/{ADMIN}/{repo}/pulls"),
                Some(json!({"head": head, "base": base, "title": title})),
            )
            .await;
        let index = pr["number"].as_i64().expect("pull request number");
        self.merge_open_pull_request(repo, index, title).await
    }

    /// Merges the open pull request `index` (a merge commit) and returns the merge commit.
    pub async fn merge_open_pull_request(&self, repo: &str, index: i64, title: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, body) = self
                .call(
                    reqwest::Method::POST,
                    &format!("/repos/{ADMIN}/{repo}/pulls/{index}/merge"),
                    Some(json!({"Do": "merge", "MergeTitleField": title})),
                )
                .await;
            if (200..300).contains(&status) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "merging pull request {index}: {status} {body}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let merged = self
            .ok(
                reqwest::Method::GET,
                &format!("/repos/{ADMIN}/{repo}/pulls/{index}"),
                None,
            )
            .await;
        assert_eq!(merged["merged"], true, "{merged}");
        merged["merge_commit_sha"]
            .as_str()
            .expect("merge commit")
            .to_string()
    }

    /// Pull request `number` of `repo`.
    pub async fn pull_request(&self, repo: &str, number: impl std::fmt::Display) -> Value {
        let path = format!("/repos/{ADMIN}/{repo}/pulls/{number}");
        self.ok(reqwest::Method::GET, &path, None).await
    }

    /// Pull request `number`'s unified diff.
    pub async fn pull_request_diff(&self, repo: &str, number: impl std::fmt::Display) -> String {
        let path = format!("/repos/{ADMIN}/{repo}/pulls/{number}.diff");
        let (status, diff) = self.call(reqwest::Method::GET, &path, None).await;
        assert_eq!(status, 200, "{path}: {diff}");
        diff.as_str().unwrap_or_default().to_string()
    }

    /// The open pull requests of `repo`.
    pub async fn open_pull_requests(&self, repo: &str) -> Vec<Value> {
        self.ok(
            reqwest::Method::GET,
            &format!("/repos/{ADMIN}/{repo}/pulls?state=open"),
            None,
        )
        .await
        .as_array()
        .cloned()
        .unwrap_or_default()
    }
}

/// A Gitea in `dir/gitea` serving HTTPS with a certificate from a fresh test CA, repository
/// `EXAMPLE_REPO` created through its API, and the example (in namespace `ns`) pushed to it over
/// HTTPS from `dir/work`. Returns Gitea, the CA's file, and the work tree.
pub async fn with_example(dir: &Path, ns: &str) -> (Gitea, PathBuf, PathBuf) {
    std::fs::create_dir_all(dir.join("gitea")).unwrap();
    let ca = super::tls::TestCa::new("linnet test CA");
    let ca_file = ca.write(dir, "ca.pem");
    let gitea = Gitea::start(&dir.join("gitea"), &ca).await;
    gitea.create_repo(EXAMPLE_REPO).await;
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    git(&work, &["init", "-q", "-b", "main"]);
    git(
        &work,
        &["config", "http.sslCAInfo", ca_file.to_str().unwrap()],
    );
    super::commit_example(&work, ns);
    git(
        &work,
        &[
            "remote",
            "add",
            "origin",
            &gitea.authed_clone_url(EXAMPLE_REPO),
        ],
    );
    git(&work, &["push", "-q", "origin", "HEAD:main"]);
    (gitea, ca_file, work)
}

/// The agent's flags for Gitea: the repository over HTTPS with the admin's token (written to
/// `dir/gitea-token`), Gitea commit statuses, and `ca_file` as the CA it trusts.
pub fn agent_args(dir: &Path, gitea: &Gitea, ca_file: &Path) -> Vec<String> {
    let token_file = dir.join("gitea-token");
    std::fs::write(&token_file, &gitea.token).unwrap();
    vec![
        format!("--repo-url={}", gitea.clone_url(EXAMPLE_REPO)),
        format!("--git-username={ADMIN}"),
        format!("--git-password-file={}", token_file.display()),
        "--commit-status-provider=gitea".into(),
        format!("--commit-status-api-url={}/api/v1", gitea.base),
        format!("--commit-status-repo={ADMIN}/{EXAMPLE_REPO}"),
        format!("--commit-status-token-file={}", token_file.display()),
        format!("--ca-file={}", ca_file.display()),
    ]
}

/// Sets every `image: <from>` of redis's spec (its own and its container's) to `to`.
pub fn set_redis_images(work: &Path, from: &str, to: &str) {
    let file = work.join("apps/redis/redis.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let edited = text.replace(&format!("image: {from}\n"), &format!("image: {to}\n"));
    assert_ne!(text, edited, "no image {from} in {text}");
    std::fs::write(&file, edited).unwrap();
}
