//! The Git source over SSH with a deploy key and a known_hosts file, against a real OpenSSH
//! server started for the test on 127.0.0.1.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use linnet::source::git::{GitAuth, GitMirror, GitRemote};

#[path = "support/ports.rs"]
mod ports;

fn run(dir: &Path, program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program} is needed for this test (.ci/run installs it): {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

struct Sshd {
    child: Child,
    port: u16,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_sshd(dir: &Path, authorized_key: &Path) -> Sshd {
    let port = ports::free_port();
    let host_key = dir.join("host_ed25519");
    run(
        dir,
        "ssh-keygen",
        &[
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-f",
            host_key.to_str().unwrap(),
        ],
    );
    let config = dir.join("sshd_config");
    std::fs::write(
        &config,
        format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nAuthorizedKeysFile {}\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n\
             StrictModes no\nUsePAM no\nPidFile {}\nLogLevel ERROR\n",
            host_key.display(),
            authorized_key.display(),
            dir.join("sshd.pid").display()
        ),
    )
    .unwrap();
    // sshd wants its privilege-separation directory.
    let _ = std::fs::create_dir_all("/run/sshd");
    let sshd = ["/usr/sbin/sshd", "/usr/bin/sshd"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect(
            "sshd is needed for this test (`make test` installs openssh-server: tests/deps.sh)",
        );
    let child = Command::new(sshd)
        .args(["-D", "-e", "-f", config.to_str().unwrap()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "sshd did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Sshd { child, port }
}

struct Setup {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    bare: PathBuf,
    head: String,
    key: PathBuf,
    sshd: Sshd,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let bare = dir.join("remote.git");
    std::fs::create_dir_all(&bare).unwrap();
    run(&bare, "git", &["init", "--bare", "-q", "-b", "main"]);
    let work = dir.join("work");
    std::fs::create_dir_all(work.join("apps")).unwrap();
    std::fs::write(
        work.join("apps/cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n",
    )
    .unwrap();
    run(&work, "git", &["init", "-q", "-b", "main"]);
    run(
        &work,
        "git",
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.invalid",
            "add",
            "-A",
        ],
    );
    run(
        &work,
        "git",
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.invalid",
            "commit",
            "-qm",
            "seed",
        ],
    );
    run(
        &work,
        "git",
        &["push", "-q", bare.to_str().unwrap(), "HEAD:main"],
    );
    let head = run(&work, "git", &["rev-parse", "HEAD"]);

    // A deploy key in PEM form, which every libssh2 build reads.
    let key = dir.join("deploy_key");
    run(
        &dir,
        "ssh-keygen",
        &[
            "-q",
            "-t",
            "rsa",
            "-b",
            "2048",
            "-m",
            "PEM",
            "-N",
            "",
            "-f",
            key.to_str().unwrap(),
        ],
    );
    let sshd = start_sshd(&dir, &dir.join("deploy_key.pub"));
    Setup {
        _tmp: tmp,
        dir,
        bare,
        head,
        key,
        sshd,
    }
}

fn remote(s: &Setup, known_hosts: PathBuf) -> GitRemote {
    let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
    GitRemote {
        url: format!("ssh://{user}@127.0.0.1:{}{}", s.sshd.port, s.bare.display()),
        branch: "main".into(),
        auth: GitAuth::SshKey {
            username: user,
            private_key: s.key.clone(),
            known_hosts,
        },
    }
}

#[test]
fn ssh_with_a_deploy_key_and_known_hosts() {
    let s = setup();
    let host_pub = std::fs::read_to_string(s.dir.join("host_ed25519.pub")).unwrap();
    let mut fields = host_pub.split_whitespace();
    let (kind, key) = (fields.next().unwrap(), fields.next().unwrap());
    let known_hosts = s.dir.join("known_hosts");
    std::fs::write(
        &known_hosts,
        format!("[127.0.0.1]:{} {kind} {key}\n", s.sshd.port),
    )
    .unwrap();

    let mirror = GitMirror::open(&s.dir.join("cache"), remote(&s, known_hosts)).unwrap();
    assert_eq!(mirror.remote_tip().unwrap().to_string(), s.head);
    let tip = mirror.fetch().unwrap();
    assert_eq!(tip.to_string(), s.head);
    assert_eq!(mirror.list_files(tip, "apps").unwrap().len(), 1);
}

#[test]
fn ssh_refuses_a_host_that_is_not_in_known_hosts() {
    let s = setup();
    let known_hosts = s.dir.join("known_hosts");
    std::fs::write(&known_hosts, "[127.0.0.1]:1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJdD7y3aLq454yWBdwLWbieU1ebz9/cu7/QEXn9OIeZJ\n").unwrap();
    let mirror = GitMirror::open(&s.dir.join("cache"), remote(&s, known_hosts)).unwrap();
    let err = mirror.remote_tip().unwrap_err();
    assert!(
        matches!(err, linnet::source::git::GitError::UnknownHostKey { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("is not in"), "{err}");
}

#[test]
fn scp_style_urls_go_over_ssh() {
    // scp-style URLs cannot name a port, so this one points at port 22 of 127.0.0.1, where
    // nothing listens in the test: the error must come from the SSH transport, which shows the
    // URL was understood (the SSH exchange itself is covered by the ssh:// test above).
    let tmp = tempfile::tempdir().unwrap();
    let remote = GitRemote {
        url: "git@127.0.0.1:acme/gitops.git".into(),
        branch: "main".into(),
        auth: GitAuth::SshKey {
            username: "git".into(),
            private_key: tmp.path().join("key"),
            known_hosts: tmp.path().join("known_hosts"),
        },
    };
    let mirror = GitMirror::open(&tmp.path().join("cache"), remote).unwrap();
    let err = mirror.remote_tip().unwrap_err();
    assert!(
        matches!(err, linnet::source::git::GitError::Unreachable { .. }),
        "{err:?}"
    );
    let text = format!("{err:?}");
    assert!(!text.contains("unsupported URL protocol"), "{text}");
}

#[test]
fn plain_paths_are_followed_like_file_urls() {
    let s = setup();
    let remote = GitRemote {
        url: s.bare.display().to_string(),
        branch: "main".into(),
        auth: GitAuth::Anonymous,
    };
    let mirror = GitMirror::open(&s.dir.join("cache-path"), remote).unwrap();
    assert_eq!(mirror.fetch().unwrap().to_string(), s.head);
}
