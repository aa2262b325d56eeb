//! `linnet validate`: the specs of a directory checked offline (and, when a cluster answers,
//! their namespaces), printed as text, JSON or GitHub annotations.

use super::*;

/// `linnet validate --output json`: the verdict, the counts and each error located.
fn validation_json(
    dir: &Path,
    set: &crate::specs::SpecSet,
    ok: bool,
    empty: Option<&str>,
) -> serde_json::Value {
    let files = set
        .objects
        .values()
        .map(|o| &*o.location.file)
        .collect::<std::collections::BTreeSet<_>>();
    let errors: Vec<serde_json::Value> = set
        .errors
        .iter()
        .map(|e| {
            serde_json::json!({
                "file": &*e.location.file,
                "line": e.location.line,
                "column": e.location.column,
                "message": e.message,
            })
        })
        .chain(empty.map(|why| serde_json::json!({"message": why})))
        .collect();
    serde_json::json!({
        "dir": dir.display().to_string(),
        "ok": ok,
        "objects": set.objects.len(),
        "files": files.len(),
        "errors": errors,
        "blockedFiles": set.blocked_files,
        "leftOut": set.left_out.iter().map(|e| serde_json::json!({
            "file": &*e.location.file,
            "line": e.location.line,
            "message": e.message,
        })).collect::<Vec<_>>(),
    })
}

/// Blocks the objects whose kind a CRD (in the set, or in `crds`) does not serve; notes the
/// groups no CRD declares.
fn check_crd_kinds(
    set: &mut crate::specs::SpecSet,
    crds: Option<&Path>,
    output: ValidateOutput,
) -> Result<()> {
    let mut kinds = crate::specs::kinds::CrdKinds::of(set);
    if let Some(path) = crds {
        add_crds_from(path, &mut kinds)?;
    }
    let unjudged = set.block_kinds_crds_do_not_serve(&kinds);
    if !unjudged.is_empty() && output == ValidateOutput::Text {
        eprintln!(
            "note: no CRD here declares the group of {} (pass --crds to check them)",
            unjudged.join(", ")
        );
    }
    Ok(())
}

/// The CRDs in `path` (a YAML file, or the YAML files of a directory), added to `kinds`.
fn add_crds_from(path: &Path, kinds: &mut crate::specs::kinds::CrdKinds) -> Result<()> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let files: Vec<std::path::PathBuf> = if path.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(path)
            .map_err(io)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| crate::specs::is_spec_file(&p.to_string_lossy()))
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_path_buf()]
    };
    // Read, not applied: the policy of what a source may apply has no say here.
    let mut opts = crate::specs::LoadOptions::default();
    opts.policy.cluster_kinds = vec!["CustomResourceDefinition".into()];
    for file in files {
        let bytes = std::fs::read(&file).map_err(|source| Error::Io {
            path: file.clone(),
            source,
        })?;
        let name = file.display().to_string();
        let loaded = crate::specs::load_file(&name, &bytes, &opts);
        if let Some(e) = loaded.errors.first() {
            return Err(Error::Usage(format!("--crds: {e}")));
        }
        for o in loaded
            .objects
            .iter()
            .filter(|o| o.key.kind == "CustomResourceDefinition")
        {
            kinds.add(&o.spec.to_json());
        }
    }
    Ok(())
}

pub(super) fn validate(
    dir: &Path,
    (output, allow_empty, unknown_fields): (ValidateOutput, bool, UnknownFields),
    (check, cluster, crds): (NamespaceCheck, &ClusterArgs, Option<&Path>),
    args: &SpecArgs,
) -> Result<ExitCode> {
    let mut set = crate::source::snapshot::load_tree(
        dir,
        &args.checking_options(unknown_fields),
        args.render.render_options(),
    )?;
    if unknown_fields == UnknownFields::Error {
        check_crd_kinds(&mut set, crds, output)?;
    }
    if let Some(why) = super::namespaces::check_namespaces(&mut set, check, cluster)? {
        eprintln!("note: namespaces not checked (no cluster to ask: {why})");
    }
    let files = set
        .objects
        .values()
        .map(|o| &*o.location.file)
        .collect::<std::collections::BTreeSet<_>>();
    let selection = &args.checking_options(unknown_fields).selection;
    let empty = empty_of(dir, &set, selection).filter(|_| !allow_empty);
    let ok = set.errors.is_empty() && empty.is_none();
    match output {
        ValidateOutput::Json => say_raw!("{}\n", validation_json(dir, &set, ok, empty.as_deref())),
        ValidateOutput::Github => {
            for e in &set.errors {
                say!("{}", github_annotation(dir, e));
            }
            for e in &set.left_out {
                let notice = github_annotation(dir, e).replacen("::error ", "::notice ", 1);
                say!("{notice}");
            }
            if let Some(why) = &empty {
                say!("::error::{}", github_escape(why, false));
            }
        }
        ValidateOutput::Text => {
            for e in &set.errors {
                say!("{e}");
            }
            for e in &set.left_out {
                say!("note: {e}");
            }
            if let Some(why) = &empty {
                say!("{why}");
            }
        }
    }
    if output != ValidateOutput::Json {
        if ok {
            say!(
                "{}: {} objects in {} files, no errors",
                dir.display(),
                set.objects.len(),
                files.len()
            );
        } else if !set.errors.is_empty() {
            say!(
                "{}: {} error(s); {} file(s) blocked: {}",
                dir.display(),
                set.errors.len(),
                set.blocked_files.len(),
                set.blocked_files.join(", ")
            );
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// A GitHub Actions error annotation for `e`, its file named from the repository's root
/// (`dir` as given, joined with the file's path below it).
pub(super) fn github_annotation(dir: &Path, e: &crate::specs::SpecError) -> String {
    let file = if dir == Path::new(".") {
        e.location.file.to_string()
    } else {
        format!(
            "{}/{}",
            dir.display().to_string().trim_end_matches('/'),
            e.location.file
        )
    };
    format!(
        "::error file={},line={},col={}::{}",
        github_escape(file.trim_start_matches("./"), true),
        e.location.line,
        e.location.column,
        github_escape(&e.message, false)
    )
}

/// Escapes text for a workflow command, as GitHub's toolkit does (`%`, CR and LF; in a
/// property also `:` and `,`).
pub(super) fn github_escape(text: &str, property: bool) -> String {
    let mut out = text
        .replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A");
    if property {
        out = out.replace(':', "%3A").replace(',', "%2C");
    }
    out
}
