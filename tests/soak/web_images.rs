//! The soak's `web` images (issue 74): distribution on 127.0.0.1 over plain HTTP (the node's
//! containerd pulls from a localhost registry over HTTP), holding the key-value server of the
//! real node's images. Tag `1.0.<n>` is version `v1`, `v2` or `v3` in turn, with `KV_IMAGE`
//! set to its own reference so that the gateway's answers name it. The image automation
//! commits each new tag to Git; nobody edits `web.yaml` after the first commit.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::support::registry::{Registry, registry_tools, run};

pub struct WebImages {
    _registry: Registry,
    tools: PathBuf,
    /// `127.0.0.1:<port>/soak/kv`
    pub repository: String,
}

impl WebImages {
    /// The registry in `dir`, with the node's `v1`, `v2` and `v3` pushed as `base-v1`…
    pub fn start(dir: &Path) -> WebImages {
        let tools = registry_tools();
        let port = super::support::ports::free_port();
        let reg_dir = dir.join("registry");
        std::fs::create_dir_all(&reg_dir).unwrap();
        let registry = Registry::start(&tools, &reg_dir, port);
        let repository = format!("127.0.0.1:{port}/soak/kv");
        let node_images = node_images();
        for version in super::TAGS {
            let layout = dir.join(format!("layout-{version}"));
            std::fs::create_dir_all(&layout).unwrap();
            let archive = node_images.join(format!("linnet.test_kv_{version}.tar"));
            let out = std::process::Command::new("tar")
                .args([
                    "-xf",
                    archive.to_str().unwrap(),
                    "-C",
                    layout.to_str().unwrap(),
                ])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "tar -xf {}: {out:?}",
                archive.display()
            );
            run(
                &tools.join("crane"),
                &[
                    "push",
                    "--insecure",
                    layout.to_str().unwrap(),
                    &format!("{repository}:base-{version}"),
                ],
            );
        }
        WebImages {
            _registry: registry,
            tools,
            repository,
        }
    }

    /// The `n`th image's reference.
    pub fn reference(&self, n: usize) -> String {
        format!("{}:1.0.{n}", self.repository)
    }

    /// Pushes the `n`th image (version `TAGS[n % 3]`); returns its reference.
    pub fn push(&self, n: usize) -> String {
        let reference = self.reference(n);
        let version = super::TAGS[n % super::TAGS.len()];
        run(
            &self.tools.join("crane"),
            &[
                "mutate",
                "--insecure",
                &format!("{}:base-{version}", self.repository),
                "--env",
                &format!("KV_IMAGE={reference}"),
                "-t",
                &reference,
            ],
        );
        reference
    }

    /// The `ImagePolicy` for `web`: every `1.x.y`, over plain HTTP, scanned every 2 s.
    pub fn policy(&self) -> String {
        format!(
            "apiVersion: rollouts.linnet.dev/v1alpha1\nkind: ImagePolicy\nmetadata:\n  name: web\n\
             spec:\n  image: {}\n  insecure: true\n  policy:\n    semver:\n      range: \">=1.0.0 <2.0.0\"\n",
            self.repository
        )
    }
}

/// Where tests/node/build.sh keeps the node's image archives.
fn node_images() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node/env.sh");
    let out = std::process::Command::new("bash")
        .args([
            "-c",
            &format!(". {}; echo \"$NODE_IMAGES\"", script.display()),
        ])
        .output()
        .unwrap();
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// `docs` as YAML, the `web` rollout's own `spec.image` line carrying the policy's marker.
pub fn web_yaml(docs: &[Value], image: &str) -> String {
    let mut text = Vec::new();
    for doc in docs {
        let yaml = serde_saphyr::to_string(doc).unwrap();
        let marked: Vec<String> = yaml
            .lines()
            .map(|line| {
                let is_spec_image = line.starts_with("  image:") && line.contains(image);
                if is_spec_image && doc["kind"] == json!("CanaryDeployment") {
                    format!("{line} # {{\"$imagepolicy\": \"web\"}}")
                } else {
                    line.to_string()
                }
            })
            .collect();
        text.push(marked.join("\n"));
    }
    let out = text.join("\n---\n") + "\n";
    assert!(out.contains("$imagepolicy"), "no marker in {out}");
    out
}
