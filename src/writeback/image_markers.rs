//! The image automation's edit (issue 74): every YAML line that carries an image policy's
//! marker comment gets the policy's newest tag, and nothing else in the file changes. Pure:
//! text in, text out. The markers are Flux's, so a repository set up for Flux's image
//! automation needs no change:
//!
//! ```yaml
//! image: registry.example/web:1.4.2 # {"$imagepolicy": "web"}        the whole reference
//! newTag: 1.4.2 # {"$imagepolicy": "apps:web:tag"}                    the tag alone
//! newName: registry.example/web # {"$imagepolicy": "web:name"}        the name alone
//! ```

use std::collections::BTreeMap;
use std::sync::LazyLock;

/// The text that makes a file worth reading at all.
pub const MARKER: &str = "$imagepolicy";

#[allow(clippy::expect_used)] // a literal pattern, tested below
static MARKED_LINE: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(
        r#"^(?P<lead>\s*(?:-\s+)?[^\s#:][^#]*?:\s+)(?P<value>"[^"\n]*"|'[^'\n]*'|[^\s#"',\[\]{}]+)(?P<gap>\s+)#\s*\{\s*"\$imagepolicy"\s*:\s*"(?P<marker>[^"\n]+)"\s*\}\s*$"#,
    )
    .expect("the marker pattern compiles")
});

/// Which part of the reference a marker sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// `name:tag`
    Whole,
    Tag,
    Name,
}

/// A marker's reading: the policy it names (`name` or `namespace:name`) and the part.
pub fn parse_marker(marker: &str) -> (String, Part) {
    match marker.rsplit_once(':') {
        Some((policy, "tag")) => (policy.to_string(), Part::Tag),
        Some((policy, "name")) => (policy.to_string(), Part::Name),
        _ => (marker.to_string(), Part::Whole),
    }
}

/// The image and tag a policy picked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pick {
    /// The repository, as the policy's `spec.image` names it.
    pub image: String,
    pub tag: String,
    /// Written after the tag on whole-reference markers (`digestPinning`).
    pub pinned: Option<String>,
}

/// One line changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// 1-based.
    pub line: usize,
    /// The marker's policy name, as written.
    pub policy: String,
    pub from: String,
    pub to: String,
}

/// `text` with every marked line set from `picks` (by the marker's policy name), and what
/// changed; `None` when no line changed. A marker naming no picked policy is left alone (its
/// policy found no tag, or does not exist: the scan says so).
pub fn set_marked_images(
    text: &str,
    picks: &BTreeMap<String, Pick>,
) -> Option<(String, Vec<Change>)> {
    if !text.contains(MARKER) {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut changes = Vec::new();
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let (body, end) = split_line_end(line);
        match edited(body, picks) {
            Some((new, policy, from, to)) => {
                out.push_str(&new);
                out.push_str(end);
                changes.push(Change {
                    line: i + 1,
                    policy,
                    from,
                    to,
                });
            }
            None => out.push_str(line),
        }
    }
    (!changes.is_empty()).then_some((out, changes))
}

/// Whether YAML reads `value`, unquoted, as the string it is (not `1718000000`, `1.10`,
/// `2026-12-04`, `on` or `null`).
fn plain_string(value: &str) -> bool {
    let number = value.parse::<f64>().is_ok()
        || value.starts_with(|c: char| c.is_ascii_digit())
            && value
                .chars()
                .all(|c| c.is_ascii_digit() || "._-".contains(c))
            && value.contains('-');
    let word = matches!(
        value.to_ascii_lowercase().as_str(),
        "true" | "false" | "yes" | "no" | "on" | "off" | "y" | "n" | "null" | "~" | ".inf" | ".nan"
    );
    !value.is_empty() && !number && !word
}

fn split_line_end(line: &str) -> (&str, &str) {
    let body = line.trim_end_matches(['\n', '\r']);
    (body, &line[body.len()..])
}

/// The line set from its policy's pick: (line, policy, old value, new value).
fn edited(body: &str, picks: &BTreeMap<String, Pick>) -> Option<(String, String, String, String)> {
    if !body.contains(MARKER) {
        return None;
    }
    let caps = MARKED_LINE.captures(body)?;
    let (policy, part) = parse_marker(&caps["marker"]);
    let pick = picks.get(&policy)?;
    let raw = &caps["value"];
    let (quote, value) = match raw.chars().next() {
        Some(q @ ('"' | '\'')) => (Some(q), &raw[1..raw.len() - 1]),
        _ => (None, raw),
    };
    let wanted = match part {
        Part::Tag => pick.tag.clone(),
        Part::Name => pick.image.clone(),
        Part::Whole => match &pick.pinned {
            Some(digest) => format!("{}:{}@{digest}", pick.image, pick.tag),
            None => format!("{}:{}", pick.image, pick.tag),
        },
    };
    if value == wanted {
        return None;
    }
    let written = match quote {
        Some(q) => format!("{q}{wanted}{q}"),
        // A tag YAML would read as a number, a date or a boolean stays a string.
        None if !plain_string(&wanted) => format!("\"{wanted}\""),
        None => wanted.clone(),
    };
    let value_at = caps.name("value")?;
    let new = format!(
        "{}{written}{}",
        &body[..value_at.start()],
        &body[value_at.end()..]
    );
    Some((new, policy, value.to_string(), wanted))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picks() -> BTreeMap<String, Pick> {
        let pick = Pick {
            image: "reg.example:5000/team/web".into(),
            tag: "1.5.0".into(),
            pinned: None,
        };
        [
            ("web".to_string(), pick.clone()),
            ("apps:web".to_string(), pick),
        ]
        .into_iter()
        .collect()
    }

    #[test]
    fn a_whole_reference_a_tag_and_a_name_are_set_and_nothing_else_moves() {
        let text = "kind: CanaryDeployment\n\
                    spec:\n  template:\n    spec:\n      containers:\n\
                    \x20       - name: web\n\
                    \x20         image: reg.example:5000/team/web:1.4.2 # {\"$imagepolicy\": \"web\"}\n\
                    images:\n\
                    \x20 - name: web\n\
                    \x20   newTag: \"1.4.2\"   # {\"$imagepolicy\": \"apps:web:tag\"}\r\n\
                    \x20   newName: old/web #{\"$imagepolicy\":\"web:name\"}\n\
                    other: 1.4.2\n";
        let (out, changes) = set_marked_images(text, &picks()).unwrap();
        assert!(
            out.contains("image: reg.example:5000/team/web:1.5.0 # {\"$imagepolicy\": \"web\"}\n")
        );
        assert!(out.contains("newTag: \"1.5.0\"   # {\"$imagepolicy\": \"apps:web:tag\"}\r\n"));
        assert!(out.contains("newName: reg.example:5000/team/web #{"));
        assert!(out.ends_with("other: 1.4.2\n"));
        assert_eq!(out.lines().count(), text.lines().count());
        let lines: Vec<usize> = changes.iter().map(|c| c.line).collect();
        assert_eq!(lines, vec![7, 10, 11]);
        assert_eq!(changes[1].from, "1.4.2");
        assert_eq!(changes[1].to, "1.5.0");
    }

    #[test]
    fn a_line_already_on_the_pick_an_unknown_policy_or_no_marker_changes_nothing() {
        let same = "image: reg.example:5000/team/web:1.5.0 # {\"$imagepolicy\": \"web\"}\n";
        assert_eq!(set_marked_images(same, &picks()), None);
        let unknown = "image: x:1 # {\"$imagepolicy\": \"api\"}\n";
        assert_eq!(set_marked_images(unknown, &picks()), None);
        assert_eq!(
            set_marked_images("image: x:1 # a comment\n", &picks()),
            None
        );
        // A marker in a comment line of its own sets nothing.
        let comment = "# image: x:1 # {\"$imagepolicy\": \"web\"}\n";
        assert_eq!(set_marked_images(comment, &picks()), None);
    }

    #[test]
    fn a_pinned_pick_writes_the_digest_on_whole_references_only() {
        let mut picks = picks();
        let digest = format!("sha256:{}", "a".repeat(64));
        picks.get_mut("web").unwrap().pinned = Some(digest.clone());
        let text = "image: x:1 # {\"$imagepolicy\": \"web\"}\nnewTag: 1 # {\"$imagepolicy\": \"web:tag\"}\n";
        let (out, _) = set_marked_images(text, &picks).unwrap();
        assert!(out.starts_with(&format!(
            "image: reg.example:5000/team/web:1.5.0@{digest} #"
        )));
        assert!(out.contains("newTag: 1.5.0 #"));
        // Once written, the same pick changes nothing.
        assert_eq!(set_marked_images(&out, &picks), None);
    }

    /// Regression: a numerical tag was written bare and read back as a number.
    #[test]
    fn a_tag_yaml_would_read_as_no_string_is_quoted_and_a_flow_mapping_keeps_its_braces() {
        let mut picks = picks();
        for tag in ["1718000000", "1.10", "2026-12-04", "on"] {
            picks.get_mut("web").unwrap().tag = tag.into();
            let (out, _) =
                set_marked_images("newTag: 1 # {\"$imagepolicy\": \"web:tag\"}\n", &picks).unwrap();
            assert_eq!(
                out,
                format!("newTag: \"{tag}\" # {{\"$imagepolicy\": \"web:tag\"}}\n")
            );
        }
        picks.get_mut("web").unwrap().tag = "1.5.0".into();
        let (out, _) =
            set_marked_images("newTag: 1.4 # {\"$imagepolicy\": \"web:tag\"}\n", &picks).unwrap();
        assert_eq!(out, "newTag: 1.5.0 # {\"$imagepolicy\": \"web:tag\"}\n");
        // A value inside a flow mapping is not read past its closing brace.
        let flow = "c: [{name: web, image: x:1}] # {\"$imagepolicy\": \"web\"}\n";
        assert_eq!(set_marked_images(flow, &picks), None);
    }

    #[test]
    fn markers_read_as_flux_writes_them() {
        assert_eq!(parse_marker("web"), ("web".into(), Part::Whole));
        assert_eq!(parse_marker("apps:web"), ("apps:web".into(), Part::Whole));
        assert_eq!(parse_marker("apps:web:tag"), ("apps:web".into(), Part::Tag));
        assert_eq!(parse_marker("web:name"), ("web".into(), Part::Name));
    }
}
