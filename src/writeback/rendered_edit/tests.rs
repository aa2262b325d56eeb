use super::*;

const OVERLAY: &str = "# Staging: the base on the newest image.\nresources:\n- ../base\nimages:\n- name: nginx\n  newTag: \"1.28\"\n- name: redis\n  newTag: 7.4.1 # pinned\n";

#[test]
fn an_image_splits_into_repository_and_tag_past_a_registry_port() {
    assert_eq!(split_image("nginx:1.27"), ("nginx", Some("1.27")));
    assert_eq!(
        split_image("registry:5000/team/api:v2"),
        ("registry:5000/team/api", Some("v2"))
    );
    assert_eq!(
        split_image("registry:5000/api"),
        ("registry:5000/api", None)
    );
    assert_eq!(split_image("nginx@sha256:abc"), ("nginx", None));
    assert_eq!(
        rendered("envs/staging/kustomization.yaml"),
        Some(Rendered::Kustomization)
    );
    assert_eq!(
        rendered("releases/c/linnet-helm.yaml"),
        Some(Rendered::HelmRelease)
    );
    assert_eq!(rendered("apps/redis.yaml"), None);
}

#[test]
fn a_revert_sets_the_overlays_new_tag_back_and_nothing_else() {
    let p = "staging/kustomization.yaml";
    let out = set_kustomize_image(p, OVERLAY, Some("nginx:1.28"), "nginx:1.27")
        .unwrap()
        .unwrap();
    assert_eq!(out, OVERLAY.replace("\"1.28\"", "\"1.27\""));
    // An unquoted tag keeps its comment; a tag that would read as a number is quoted.
    let out = set_kustomize_image(p, OVERLAY, Some("redis:7.4.1"), "redis:7.2")
        .unwrap()
        .unwrap();
    assert!(out.contains("  newTag: \"7.2\" # pinned\n"), "{out}");
    // Git moved on (a person set another tag): nothing to revert.
    assert_eq!(
        set_kustomize_image(p, OVERLAY, Some("nginx:1.29"), "nginx:1.27"),
        Ok(None)
    );
    // The failed image is the base's (no entry): the shared base is not edited.
    let e = set_kustomize_image(
        p,
        "resources: [../base]\n",
        Some("nginx:1.28"),
        "nginx:1.27",
    )
    .unwrap_err();
    assert!(e.to_string().contains("no entry for nginx"), "{e}");
}

#[test]
fn a_promotion_sets_or_adds_the_overlays_entry() {
    let p = "production/kustomization.yaml";
    // An entry: its tag.
    let out = set_kustomize_image(p, OVERLAY, None, "nginx:1.29")
        .unwrap()
        .unwrap();
    assert_eq!(out, OVERLAY.replace("\"1.28\"", "\"1.29\""));
    assert_eq!(
        set_kustomize_image(p, OVERLAY, None, "nginx:1.28"),
        Ok(None)
    );
    // No entry for it among others: one is added under images:.
    let other = "resources: [../base]\nimages:\n  - name: redis\n    newTag: \"7.2\"\n";
    let out = set_kustomize_image(p, other, None, "nginx:1.29")
        .unwrap()
        .unwrap();
    assert_eq!(
        kustomize_image(&out, "nginx").as_deref(),
        Some("nginx:1.29")
    );
    assert_eq!(kustomize_image(&out, "redis").as_deref(), Some("redis:7.2"));
    // No images: at all: added at the end.
    let bare = "resources: [../base]\nnamespace: production";
    let out = set_kustomize_image(p, bare, None, "nginx:1.29")
        .unwrap()
        .unwrap();
    assert_eq!(
        out,
        "resources: [../base]\nnamespace: production\nimages:\n- name: \"nginx\"\n  newTag: \"1.29\"\n"
    );
    // A newName entry moves to the new name's tag.
    let renamed = "images:\n- name: nginx\n  newName: mirror/nginx\n  newTag: \"1.28\"\n";
    let out = set_kustomize_image(p, renamed, None, "mirror/nginx:1.29")
        .unwrap()
        .unwrap();
    assert_eq!(out, renamed.replace("1.28", "1.29"));
}

#[test]
fn a_helm_release_gets_the_image_where_its_values_set_it() {
    let release = "chart: ../../charts/cache\nvaluesFiles:\n- values.yaml\n- ../shared/prod.yaml\n";
    assert_eq!(
        helm_value_sources("releases/cache/linnet-helm.yaml", release),
        vec![
            "releases/cache/linnet-helm.yaml",
            "releases/shared/prod.yaml",
            "releases/cache/values.yaml"
        ]
    );
    // The whole image.
    let values = "replicas: 2\nimage: redis:7.4 # the canary's\n";
    assert_eq!(
        set_values_image(values, Some("redis:7.4"), "redis:7.2"),
        ValuesEdit::Edited("replicas: 2\nimage: redis:7.2 # the canary's\n".into())
    );
    assert_eq!(
        set_values_image(values, Some("redis:7.0"), "redis:7.2"),
        ValuesEdit::NotHere
    );
    assert_eq!(
        set_values_image(values, None, "redis:7.4"),
        ValuesEdit::Already
    );
    // Repository and tag apart.
    let split = "image:\n  repository: redis\n  tag: \"7.4\"\n";
    assert_eq!(
        set_values_image(split, Some("redis:7.4"), "redis:7.2"),
        ValuesEdit::Edited(split.replace("7.4", "7.2"))
    );
    assert_eq!(
        set_values_image(split, None, "redis:7.6"),
        ValuesEdit::Edited(split.replace("7.4", "7.6"))
    );
    // Another repository's tag is not this image's.
    assert_eq!(
        set_values_image(
            "image:\n  repository: nginx\n  tag: \"7.4\"\n",
            None,
            "redis:7.6"
        ),
        ValuesEdit::NotHere
    );
}

#[test]
fn a_tag_written_as_a_number_is_still_the_tag() {
    let overlay = "images:\n- name: nginx\n  newTag: 1.27\n";
    assert_eq!(
        kustomize_image(overlay, "nginx").as_deref(),
        Some("nginx:1.27")
    );
    let out = set_kustomize_image(
        "k/kustomization.yaml",
        overlay,
        Some("nginx:1.27"),
        "nginx:1.26",
    )
    .unwrap()
    .unwrap();
    assert_eq!(out, "images:\n- name: nginx\n  newTag: \"1.26\"\n");
}
