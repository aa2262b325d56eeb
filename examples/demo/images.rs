//! The demo's image automation step (issue 74): a registry on 127.0.0.1 (distribution, built
//! with crane by tests/registry/build.sh), an `ImagePolicy` in Git and a rollout whose image
//! line carries its marker. A new tag pushed to the registry, and the registry's webhook, make
//! linnet commit the tag to Git and canary it: no edit of Git by hand.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube::{Api, Client};
use linnet::api::CanaryDeployment;

use super::{NS, Step, git, say, wait};

/// The registry, killed when dropped.
struct Registry(Child);

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run(program: &Path, args: &[&str]) -> Step<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} {args:?}: {}",
            program.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn start_registry(tools: &Path, dir: &Path, port: u16) -> Step<Registry> {
    let config = dir.join("registry.yml");
    let text = format!(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
        dir.join("registry").display()
    );
    std::fs::write(&config, text).map_err(|e| e.to_string())?;
    let child = Command::new(tools.join("registry"))
        .args(["serve", &config.to_string_lossy()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the registry: {e}"))?;
    let registry = Registry(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err("the registry did not start".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(registry)
}

/// Pushes a one-layer image holding `content` as `reference`.
fn push_image(tools: &Path, dir: &Path, reference: &str, content: &str) -> Step<()> {
    let layer = dir.join("layer");
    std::fs::create_dir_all(&layer).map_err(|e| e.to_string())?;
    std::fs::write(layer.join("version"), content).map_err(|e| e.to_string())?;
    let tar = dir.join("layer.tar");
    let (tar_s, layer_s) = (tar.to_string_lossy(), layer.to_string_lossy());
    run(
        Path::new("tar"),
        &["-cf", &tar_s, "-C", &layer_s, "version"],
    )?;
    run(
        &tools.join("crane"),
        &["append", "--insecure", "-f", &tar_s, "-t", reference],
    )?;
    println!("    $ crane append -f layer.tar -t {reference}");
    Ok(())
}

fn shop(repository: &str) -> String {
    format!(
        "apiVersion: rollouts.linnet.dev/v1alpha1
kind: CanaryDeployment
metadata:
  name: cart
  namespace: {NS}
spec:
  replicas: 2
  image: {repository}:1.0.0 # {{\"$imagepolicy\": \"cart\"}}
  strategy:
    type: Batches
  batches: 2
  pause: None
  progressDeadlineSeconds: 60
  template:
    selector:
      matchLabels:
        app: cart
    template:
      metadata:
        labels:
          app: cart
      spec:
        containers:
          - name: cart
            image: {repository}:1.0.0
---
apiVersion: rollouts.linnet.dev/v1alpha1
kind: ImagePolicy
metadata:
  name: cart
spec:
  image: {repository}
  insecure: true
  policy:
    semver:
      range: \">=1.0.0 <2.0.0\"
"
    )
}

async fn cart_images(client: &Client) -> Option<(String, String)> {
    let api = Api::<CanaryDeployment>::namespaced(client.clone(), NS);
    let status = api.get_opt("cart").await.ok().flatten()?.status?;
    Some((
        status.stable_image.unwrap_or_default(),
        status.canary_image.unwrap_or_default(),
    ))
}

/// `hooks`: the agent's webhook address; `secret`: its webhook secret.
pub async fn images_step(
    client: &Client,
    work: &Path,
    scratch: &Path,
    hooks: &str,
    secret: &str,
    push: impl Fn(&str) -> Step<()>,
) -> Step<()> {
    say(
        "9. Image automation: a new tag pushed to a registry is committed to Git by linnet and canaried, with no edit of Git by hand",
    );
    let tools = run(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/registry/build.sh"),
        &[],
    )?;
    let tools = Path::new(tools.lines().last().unwrap_or_default()).to_path_buf();
    let port = super::ports::free_port();
    let _registry = start_registry(&tools, scratch, port)?;
    let repository = format!("127.0.0.1:{port}/demo/cart");
    println!("    registry: http://127.0.0.1:{port} (distribution, built from its Go module)");
    push_image(&tools, scratch, &format!("{repository}:1.0.0"), "1.0.0")?;
    std::fs::write(work.join("apps/cart.yaml"), shop(&repository)).map_err(|e| e.to_string())?;
    git(work, &["add", "apps/cart.yaml"])?;
    push("cart, its image set by ImagePolicy cart (semver >=1.0.0 <2.0.0)")?;
    let first = format!("{repository}:1.0.0");
    wait("cart to be stable on 1.0.0", 120, || async {
        cart_images(client)
            .await
            .filter(|(s, _)| *s == first)
            .map(|_| ())
    })
    .await?;
    push_image(&tools, scratch, &format!("{repository}:1.1.0"), "1.1.0")?;
    // The registry's webhook, as distribution's notifications send it.
    let body =
        r#"{"events":[{"action":"push","target":{"repository":"demo/cart","tag":"1.1.0"}}]}"#;
    linnet::net::install_crypto_provider();
    let answer = reqwest::Client::new()
        .post(format!("{hooks}/hooks/registry"))
        .header("authorization", format!("Bearer {secret}"))
        .body(body)
        .send()
        .await
        .map_err(|e| format!("the registry webhook: {e}"))?;
    println!(
        "    registry webhook -> /hooks/registry: {}",
        answer.status()
    );
    let second = format!("{repository}:1.1.0");
    wait("cart to canary 1.1.0", 60, || async {
        cart_images(client)
            .await
            .filter(|(s, c)| *c == second || *s == second)
            .map(|_| ())
    })
    .await?;
    git(work, &["pull", "-q", "--rebase", "origin", "main"])?;
    println!(
        "    linnet's commit on main:\n{}",
        git(work, &["log", "-1", "--format=      %s%n%n%b", "main"])?
    );
    Ok(())
}
