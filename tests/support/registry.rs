//! distribution's registry and crane, built from their Go modules (once per machine) by
//! tests/registry/build.sh: a real OCI registry for the image and image automation tests
//! (and `make demo`'s step 9, which includes this file).
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `program` with `args`; panics with its output when it fails.
pub fn run(program: &Path, args: &[&str]) -> Output {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{} {args:?} failed:\n{}{}",
        program.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The directory holding `crane` and `registry`.
pub fn registry_tools() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/registry/build.sh");
    let out = run(&script, &[]);
    stdout(&out).lines().last().unwrap().trim().into()
}

/// distribution's registry on `port`, storing in `dir` (over HTTPS with `tls`, a certificate
/// and key in PEM); killed when dropped.
pub struct Registry(Child);

impl Registry {
    pub fn start(bin: &Path, dir: &Path, port: u16) -> Registry {
        Registry::start_with(bin, dir, port, None)
    }

    pub fn start_with(
        bin: &Path,
        dir: &Path,
        port: u16,
        tls: Option<&super::tls::ServerCert>,
    ) -> Registry {
        Registry::start_private(bin, dir, port, tls, None)
    }

    /// With `htpasswd` (a file of `user:bcrypt-hash` lines), every request needs Basic
    /// credentials, as a private registry's do.
    pub fn start_private(
        bin: &Path,
        dir: &Path,
        port: u16,
        tls: Option<&super::tls::ServerCert>,
        htpasswd: Option<&Path>,
    ) -> Registry {
        let mut http = format!("http:\n  addr: 127.0.0.1:{port}\n");
        if let Some(cert) = tls {
            let (c, k) = (dir.join("registry.crt"), dir.join("registry.key"));
            std::fs::write(&c, &cert.cert_pem).unwrap();
            std::fs::write(&k, &cert.key_pem).unwrap();
            http.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                c.display(),
                k.display()
            ));
        }
        if let Some(file) = htpasswd {
            http.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: test-registry\n    path: {}\n",
                file.display()
            ));
        }
        let config = dir.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n{http}",
                dir.join("data").display()
            ),
        )
        .unwrap();
        let child = Command::new(bin.join("registry"))
            .args(["serve", config.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("registry.log")).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the registry did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        Registry(child)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Pushes a one-layer image holding `content` as `reference` (crane, TLS unchecked: the
/// test's own registry) and returns its digest.
pub fn push_image(tools: &Path, dir: &Path, reference: &str, content: &str) -> String {
    push_image_as(tools, dir, reference, content, None)
}

/// As [`push_image`], with crane's credentials from the Docker config directory
/// `docker_config` (`DOCKER_CONFIG`) when given.
pub fn push_image_as(
    tools: &Path,
    dir: &Path,
    reference: &str,
    content: &str,
    docker_config: Option<&Path>,
) -> String {
    let crane_run = |args: &[&str]| {
        let mut command = Command::new(tools.join("crane"));
        command.args(args);
        if let Some(d) = docker_config {
            command.env("DOCKER_CONFIG", d);
        }
        let out = command.output().unwrap();
        assert!(
            out.status.success(),
            "crane {args:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    let layer_dir = dir.join("layer");
    let _ = std::fs::remove_dir_all(&layer_dir);
    std::fs::create_dir_all(&layer_dir).unwrap();
    std::fs::write(layer_dir.join("version"), content).unwrap();
    let tar = dir.join("layer.tar");
    let out = Command::new("tar")
        .args([
            "-cf",
            tar.to_str().unwrap(),
            "-C",
            layer_dir.to_str().unwrap(),
            "version",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "tar failed");
    crane_run(&[
        "append",
        "--insecure",
        "-f",
        tar.to_str().unwrap(),
        "-t",
        reference,
    ]);
    stdout(&crane_run(&["digest", "--insecure", reference]))
        .trim()
        .to_string()
}

/// Points `tag` (of the repository of `reference`) at `reference`'s manifest.
pub fn tag_image(tools: &Path, reference: &str, tag: &str) {
    run(&tools.join("crane"), &["tag", "--insecure", reference, tag]);
}

/// CanaryDeployment `web` in `ns`, 2 replicas in 2 batches, its image line marked for the
/// policy `web` (as Flux marks it).
pub fn marked_web(ns: &str, image: &str) -> String {
    format!(
        r#"apiVersion: rollouts.linnet.dev/v1alpha1
kind: CanaryDeployment
metadata:
  name: web
  namespace: {ns}
spec:
  replicas: 2
  image: {image} # {{"$imagepolicy": "web"}}
  strategy:
    type: Batches
  batches: 2
  pause: None
  progressDeadlineSeconds: 60
  template:
    selector:
      matchLabels:
        app: web
    template:
      metadata:
        labels:
          app: web
      spec:
        containers:
          - name: web
            image: nginx:1.27
"#
    )
}

/// ImagePolicy `web` on `repository`: `>=1.0.0 <2.0.0`.
pub fn semver_policy(repository: &str) -> String {
    format!(
        r#"apiVersion: rollouts.linnet.dev/v1alpha1
kind: ImagePolicy
metadata:
  name: web
spec:
  image: {repository}
  policy:
    semver:
      range: ">=1.0.0 <2.0.0"
"#
    )
}

/// Sets the build time (`created`) of the image at `reference`, and pushes it under the same
/// tag (crane edit config, the config on stdin).
pub fn set_created(tools: &Path, reference: &str, created: &str) {
    let crane = tools.join("crane");
    let config = stdout(&run(&crane, &["config", "--insecure", reference]));
    let mut config: serde_json::Value = serde_json::from_str(&config).unwrap();
    config["created"] = serde_json::json!(created);
    let mut child = Command::new(&crane)
        .args(["edit", "config", "--insecure", reference, "-t", reference])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(config.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "crane edit config {reference}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
