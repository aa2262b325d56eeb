//! The demo's image automation step (issue 74): a registry on 127.0.0.1 (distribution, built
//! with crane by tests/registry/build.sh), an `ImagePolicy` in Git and a rollout whose image
//! line carries its marker. A new tag pushed to the registry, and the registry's webhook, make
//! linnet commit the tag to Git and canary it: no edit of Git by hand.

use std::path::Path;

use kube::{Api, Client};
use linnet::api::CanaryDeployment;

use super::registry::{Registry, push_image, registry_tools};
use super::{NS, Step, git, say, wait};

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
    let tools = registry_tools();
    let port = super::ports::free_port();
    let _registry = Registry::start(&tools, scratch, port);
    let repository = format!("127.0.0.1:{port}/demo/cart");
    println!("    registry: http://127.0.0.1:{port} (distribution, built from its Go module)");
    push_image(&tools, scratch, &format!("{repository}:1.0.0"), "1.0.0");
    println!("    $ crane append -f layer.tar -t {repository}:1.0.0");
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
    push_image(&tools, scratch, &format!("{repository}:1.1.0"), "1.1.0");
    println!("    $ crane append -f layer.tar -t {repository}:1.1.0");
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
