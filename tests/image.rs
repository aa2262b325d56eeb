//! `make image` (issue 47): the image is built without Docker, pushed to a real registry
//! (distribution's, built from its Go module), pulled back with crane, and its config and its
//! binary are checked: user 65532, `linnet agent`, labels with the version and the commit, and
//! a static binary that runs in the image's own filesystem.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::process::Command;

use support::registry::{Registry, registry_tools, run, stdout};

#[test]
fn make_image_builds_an_image_that_a_registry_takes_and_that_runs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("image");
    // What a release does, in the dev profile (the release build takes several minutes more).
    let make = Command::new("make")
        .current_dir(root)
        .args([
            "image",
            "IMAGE_PROFILE=dev",
            &format!("IMAGE_DIR={}", layout.display()),
        ])
        .output()
        .unwrap();
    assert!(
        make.status.success(),
        "make image failed:\n{}{}",
        stdout(&make),
        String::from_utf8_lossy(&make.stderr)
    );
    let tools = registry_tools();
    let crane = tools.join("crane");
    let port = support::ports::free_port();
    let _registry = Registry::start(&tools, dir.path(), port);
    let reference = format!("127.0.0.1:{port}/linnet:test");

    // Pushed as make image-push does, then read back from the registry.
    run(
        &crane,
        &["push", "--insecure", layout.to_str().unwrap(), &reference],
    );
    let config: serde_json::Value =
        serde_json::from_str(&stdout(&run(&crane, &["config", "--insecure", &reference]))).unwrap();
    let c = &config["config"];
    assert_eq!(c["User"], "65532:65532", "{config}");
    assert_eq!(
        c["Entrypoint"],
        serde_json::json!(["/usr/local/bin/linnet"])
    );
    assert_eq!(c["Cmd"], serde_json::json!(["agent"]));
    let labels = &c["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    let head = Command::new("git")
        .current_dir(root)
        .args(["rev-parse", "HEAD"])
        .output()
        .unwrap();
    let head = stdout(&head).trim().to_string();
    assert_eq!(labels["org.opencontainers.image.revision"], head.as_str());
    assert_eq!(config["architecture"], "amd64");

    // The image's filesystem, as pulled: the binary runs in it alone (static: no loader, no
    // shared libraries), as the image's user.
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir_all(&rootfs).unwrap();
    let exported = dir.path().join("fs.tar");
    run(
        &crane,
        &[
            "export",
            "--insecure",
            &reference,
            exported.to_str().unwrap(),
        ],
    );
    run(
        Path::new("tar"),
        &[
            "-xf",
            exported.to_str().unwrap(),
            "-C",
            rootfs.to_str().unwrap(),
        ],
    );
    let binary = rootfs.join("usr/local/bin/linnet");
    let ldd = Command::new("ldd").arg(&binary).output().unwrap();
    let said = format!("{}{}", stdout(&ldd), String::from_utf8_lossy(&ldd.stderr));
    assert!(
        said.contains("statically linked") || said.contains("not a dynamic executable"),
        "the binary is not static:\n{said}"
    );
    let version = if running_as_root() {
        // chroot: nothing of this machine's filesystem, as in a container.
        run(
            Path::new("chroot"),
            &[
                "--userspec=65532:65532",
                rootfs.to_str().unwrap(),
                "/usr/local/bin/linnet",
                "--version",
            ],
        )
    } else {
        run(&binary, &["--version"])
    };
    assert_eq!(
        stdout(&version).trim(),
        format!("linnet {}", env!("CARGO_PKG_VERSION"))
    );
    assert!(rootfs.join("etc/ssl/certs/ca-certificates.crt").exists());
    // The renderers ship beside it (issue 48), and render the example's overlays and chart
    // inside the image's filesystem alone.
    for tool in ["kustomize", "helm"] {
        assert!(
            rootfs.join("usr/local/bin").join(tool).is_file(),
            "{tool} is not in the image"
        );
    }
    if running_as_root() {
        let example = rootfs.join("tmp/example");
        run(
            Path::new("cp"),
            &[
                "-r",
                concat!(env!("CARGO_MANIFEST_DIR"), "/examples/gitops-repo"),
                example.to_str().unwrap(),
            ],
        );
        // Found in this PATH: the command's own PATH is the image's.
        let chroot = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|d| d.join("chroot"))
            .find(|p| p.is_file())
            .expect("chroot in PATH");
        let out = Command::new(chroot)
            .args(["--userspec=65532:65532", rootfs.to_str().unwrap()])
            .args([
                "/usr/local/bin/linnet",
                "validate",
                "--check-namespaces",
                "never",
                "/tmp/example",
            ])
            .env_clear()
            .env("PATH", "/usr/local/bin")
            .output()
            .unwrap();
        let said = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && said.contains("no errors"), "{said}");
    }
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(passwd.contains("nonroot:x:65532:65532"), "{passwd}");
}

/// Whether the test runs as root (then it can chroot into the image's filesystem).
fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| stdout(&o).trim() == "0")
}
