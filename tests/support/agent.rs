//! The `linnet agent` binary as a test runs it: started with a source, a webhook secret and a
//! scratch directory, killed (SIGKILL, like `kill -9`) when dropped, its log printed when the
//! test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::ports::free_port;

/// The secret the test agents verify webhooks with.
pub const SECRET: &str = "hook-secret-for-linnet-tests";

/// The agent process; killed when dropped.
pub struct Agent {
    pub child: Child,
    /// Its `--admin-listen`: `/status`, `/metrics`, `/readyz`.
    pub base: String,
    /// Its `--listen`: `/hooks/*`.
    pub hooks: String,
    pub log: PathBuf,
}

impl Agent {
    /// Its `/metrics` text.
    pub async fn metrics(&self) -> String {
        super::http()
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Its `/status`.
    pub async fn status(&self) -> serde_json::Value {
        super::http()
            .get(format!("{}/status", self.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Sends it a signed generic push webhook for `main`, as a Git host would after a push;
    /// returns the HTTP status.
    pub async fn push_webhook(&self) -> u16 {
        let body = br#"{"ref":"refs/heads/main"}"#;
        let sig = linnet::source::webhook::sign_hex(SECRET.as_bytes(), body);
        super::http()
            .post(format!("{}/hooks/generic", self.hooks))
            .header("x-linnet-signature", format!("sha256={sig}"))
            .body(body.to_vec())
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    /// Kills the process at once (SIGKILL): no shutdown, no last writes.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops the process as Kubernetes does (SIGTERM), and waits up to 20 s for it to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the agent did not stop within 20 s of SIGTERM:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits up to `within` for the process to exit by itself (a refusal, a fault), and
    /// returns how; fails naming `what` was expected, with the log, if it goes on running.
    pub async fn exited_within(
        &mut self,
        within: Duration,
        what: &str,
    ) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the agent kept running past {within:?}; expected {what}:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (30 s at most) for `needle` in the agent's log; `what` names it in a failure.
    pub async fn wait_for_log(&self, what: &str, needle: &str) {
        super::eventually(what, Duration::from_secs(30), || {
            let found = self.log_text().contains(needle);
            async move { found.then_some(()) }
        })
        .await;
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("---- agent log {}\n{}", self.log.display(), self.log_text());
        }
    }
}

/// Starts `linnet agent` as user `linnet` (bound to the shipped ClusterRole by
/// `install_linnet`) with `source_args` (e.g. `--repo-url=...`), source name `ns`, and, unless
/// the args say otherwise, only namespace `ns` allowed. Logs go to `dir/agent.log` (appended,
/// so a restarted agent keeps the first one's lines).
pub fn start_agent(dir: &Path, source_args: &[String], ns: &str) -> Agent {
    start_agent_with(dir, source_args, ns, &super::linnet_kubeconfig())
}

/// [`start_agent`] in `dir` (made if need be) following the bare repository `bare`, writing
/// back every 500 ms: the agent of the tests that watch linnet commit to Git.
pub fn start_writing_agent(dir: &Path, bare: &Path, ns: &str) -> Agent {
    std::fs::create_dir_all(dir).unwrap();
    start_agent(
        dir,
        &[
            format!("--repo-url=file://{}", bare.display()),
            "--writeback-interval=500ms".into(),
        ],
        ns,
    )
}

/// [`start_agent`] with the identity of `kubeconfig`.
pub fn start_agent_with(dir: &Path, source_args: &[String], ns: &str, kubeconfig: &Path) -> Agent {
    start_agent_env(dir, source_args, ns, kubeconfig, &[])
}

/// [`start_agent_with`] with `env` set for the agent alone.
pub fn start_agent_env(
    dir: &Path,
    source_args: &[String],
    ns: &str,
    kubeconfig: &Path,
    env: &[(&str, &str)],
) -> Agent {
    let port = free_port();
    let admin_port = free_port();
    let log = dir.join("agent.log");
    let secret = dir.join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .unwrap();
    // LINNET_TEST_AGENT_BIN runs another build, e.g. the commit before a fix, to see a
    // regression test fail without it.
    let bin = std::env::var("LINNET_TEST_AGENT_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_linnet").to_string());
    let has = |flag: &str| source_args.iter().any(|a| a.starts_with(flag));
    let child = Command::new(bin)
        .arg("agent")
        .args(source_args)
        .args(if has("--poll-interval") {
            vec![]
        } else {
            vec!["--poll-interval", "1h"]
        })
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin-listen",
            &format!("127.0.0.1:{admin_port}"),
        ])
        .args(["--webhook-secret-file", secret.to_str().unwrap()])
        .args(["--cache-dir", dir.join("cache").to_str().unwrap()])
        .args(if has("--source-name") {
            vec![]
        } else {
            vec!["--source-name", ns]
        })
        // The account the shipped ClusterRole may impersonate (one name for every source); a
        // test naming its source gets that source's default account.
        .args(if has("--apply-as") || has("--source-name") {
            vec![]
        } else {
            vec!["--apply-as", super::SOURCE_ACCOUNT]
        })
        // The lease lives in the test's namespace; a restarted agent keeps its identity and so
        // takes its own lease back at once.
        .args(["--lease-namespace", ns, "--lease-duration", "4s"])
        .args(
            if source_args
                .iter()
                .any(|a| a.starts_with("--lease-identity"))
            {
                vec![]
            } else {
                vec!["--lease-identity".to_string(), format!("agent-{ns}")]
            },
        )
        .args(
            if source_args
                .iter()
                .any(|a| a.starts_with("--allow-namespace"))
            {
                vec![]
            } else {
                vec!["--allow-namespace", ns]
            },
        )
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "linnet=debug")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .unwrap();
    Agent {
        child,
        base: format!("http://127.0.0.1:{admin_port}"),
        hooks: format!("http://127.0.0.1:{port}"),
        log,
    }
}

pub async fn wait_ready(agent: &Agent) {
    wait_ready_at(&agent.base).await
}

/// Waits until the agent at `base` (e.g. `http://127.0.0.1:8080`) answers `/readyz` with 200.
pub async fn wait_ready_at(base: &str) {
    wait_ready_within(base, Duration::from_secs(30)).await
}

/// [`wait_ready_at`], for as long as `within`: an agent starting on a large repository is
/// ready after its first sync.
pub async fn wait_ready_within(base: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(r) = super::http().get(format!("{base}/readyz")).send().await
            && r.status() == 200
        {
            return;
        }
        assert!(Instant::now() < deadline, "agent never became ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
