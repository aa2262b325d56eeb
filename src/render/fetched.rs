//! The fields of a kustomization that kustomize reads a file from besides `resources`,
//! `bases` and `components` (generators' files and env files, patches, replacements, the
//! OpenAPI schema, CRDs, configurations, a Helm chart's values): each may be an `http(s)://`
//! URL, which kustomize fetches, and Go fetches a loopback address without the proxy the
//! offline render points at a closed port. Each whose host is not allowed is refused before
//! kustomize runs (issue 70: a `configMapGenerator` file at the agent's own admin port put
//! its `/status` and metrics into a ConfigMap the writer could read).

use serde_json::Value;

use super::{RenderOptions, error_at, locate_text, remote_host};
use crate::specs::SpecError;

fn items(v: Option<&Value>) -> impl Iterator<Item = &Value> {
    v.and_then(Value::as_array).into_iter().flatten()
}

fn strings(v: Option<&Value>) -> impl Iterator<Item = &str> {
    items(v).filter_map(Value::as_str)
}

/// Each string kustomize reads as a path (or URL), with the field it is in.
fn read_paths(v: &Value) -> Vec<(String, &str)> {
    let mut out = Vec::new();
    for generator in ["configMapGenerator", "secretGenerator"] {
        for (i, g) in items(v.get(generator)).enumerate() {
            for field in ["files", "envs"] {
                for s in strings(g.get(field)) {
                    // `key=path`: the path follows the first `=`.
                    let path = s.split_once('=').map_or(s, |(_, p)| p);
                    out.push((format!("{generator}[{i}].{field}"), path));
                }
            }
            if let Some(s) = g.get("env").and_then(Value::as_str) {
                out.push((format!("{generator}[{i}].env"), s));
            }
        }
    }
    for (field, key) in [
        ("patches", "path"),
        ("patchesJson6902", "path"),
        ("replacements", "path"),
        ("helmCharts", "valuesFile"),
        ("helmCharts", "repo"),
    ] {
        for (i, item) in items(v.get(field)).enumerate() {
            if let Some(s) = item.get(key).and_then(Value::as_str) {
                out.push((format!("{field}[{i}].{key}"), s));
            }
        }
    }
    for field in [
        "patchesStrategicMerge",
        "crds",
        "configurations",
        "generators",
        "transformers",
        "validators",
    ] {
        // A patch or plugin written inline is several lines, not a path.
        for s in strings(v.get(field)).filter(|s| !s.contains('\n')) {
            out.push((field.to_string(), s));
        }
    }
    if let Some(s) = v
        .get("openapi")
        .and_then(|o| o.get("path"))
        .and_then(Value::as_str)
    {
        out.push(("openapi.path".into(), s));
    }
    out
}

/// Refuses kustomization `path` (parsed `v`, written `text`) when a field kustomize reads a
/// file from names a URL whose host `render` does not allow.
pub(super) fn check(
    path: &str,
    v: &Value,
    text: &str,
    render: &RenderOptions,
) -> Result<(), SpecError> {
    for (field, read) in read_paths(v) {
        if !read.contains("://") {
            continue;
        }
        let host = remote_host(read).unwrap_or_default();
        if render.allows_host(&host) {
            continue;
        }
        let (line, column) = locate_text(text, read);
        let shown = crate::text::one_line(read, 200);
        let fix = if host.is_empty() {
            "a URL linnet cannot read a host from is never fetched".to_string()
        } else {
            format!("or let the agent fetch from {host} with --render-allow-host {host}")
        };
        return Err(error_at(
            path,
            line,
            column,
            format!(
                "`{field}` reads `{shown}`, a URL, and rendering is offline: linnet renders \
                 what the repository holds. Put the file in the repository, {fix}"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(kustomization: &str, render: &RenderOptions) -> Option<String> {
        let v: Value = serde_saphyr::from_str(kustomization).unwrap();
        check("app/kustomization.yaml", &v, kustomization, render)
            .err()
            .map(|e| e.to_string())
    }

    #[test]
    fn every_field_kustomize_reads_a_url_from_is_checked() {
        // Issue 70: only resources, bases and components were, so a generator's file at the
        // agent's admin port was fetched into a ConfigMap.
        let offline = RenderOptions::default();
        for kustomization in [
            "configMapGenerator:\n- name: x\n  files:\n  - status=http://127.0.0.1:9090/status\n",
            "configMapGenerator:\n- name: x\n  files: [http://127.0.0.1:9090/metrics]\n",
            "configMapGenerator:\n- name: x\n  envs: [https://169.254.169.254/latest/meta-data]\n",
            "secretGenerator:\n- name: x\n  env: HTTP://localhost:9090/status\n",
            "patches:\n- path: http://127.0.0.1:9090/status\n",
            "patchesJson6902:\n- path: http://127.0.0.1/p\n  target: {kind: X, name: y}\n",
            "patchesStrategicMerge: [http://127.0.0.1/p.yaml]\n",
            "replacements:\n- path: http://127.0.0.1:9090/r.yaml\n",
            "openapi:\n  path: http://127.0.0.1:9090/schema.json\n",
            "crds: [http://127.0.0.1/crd.yaml]\n",
            "configurations: [http://127.0.0.1/c.yaml]\n",
            "helmCharts:\n- name: c\n  valuesFile: http://127.0.0.1/v.yaml\n",
        ] {
            let why = refusal(kustomization, &offline)
                .unwrap_or_else(|| panic!("not refused:\n{kustomization}"));
            assert!(
                why.contains("rendering is offline") && why.contains("app/kustomization.yaml:"),
                "{why}"
            );
        }
        // Local paths and inline patches are kustomize's to read.
        for kustomization in [
            "configMapGenerator:\n- name: x\n  files: [status=files/status.txt]\n  literals: [url=https://example.com]\n",
            "patches:\n- path: patch.yaml\n- patch: |\n    - op: add\n      path: /x\n      value: http://127.0.0.1/\n",
        ] {
            assert_eq!(refusal(kustomization, &offline), None, "{kustomization}");
        }
    }

    #[test]
    fn an_allowed_host_is_fetched_and_only_it() {
        // Issue 70: a file on another host was fetched with --render-allow-host set.
        let allowed = RenderOptions {
            allowed_hosts: vec!["allowed.example".into()],
            ..RenderOptions::default()
        };
        let ok = "configMapGenerator:\n- name: x\n  files: [https://allowed.example/a.txt]\n";
        assert_eq!(refusal(ok, &allowed), None);
        for other in [
            "configMapGenerator:\n- name: x\n  files: [https://other.example/a.txt]\n",
            "configMapGenerator:\n- name: x\n  files: [\"https://127.0.0.1:12593#@allowed.example\"]\n",
            "configMapGenerator:\n- name: x\n  files: [\"https://allowed.example@127.0.0.1/a\"]\n",
            "configMapGenerator:\n- name: x\n  files: [\"https://allowed.example.127.0.0.1.nip.io/a\"]\n",
        ] {
            assert!(refusal(other, &allowed).is_some(), "{other}");
        }
    }
}
