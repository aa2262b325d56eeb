//! Finds where a key path sits in a YAML document's text, for errors found after parsing
//! (CEL rules, semantic checks). It reads indentation only, which is enough for block-style
//! YAML; when a path cannot be found the caller falls back to the document's start.

/// Returns the 1-based `(line, column)` of the last key of `path`, searching `doc` by
/// indentation. Numeric segments (list indices) are skipped.
pub fn find_key(doc: &str, path: &[&str]) -> Option<(u64, u64)> {
    let lines: Vec<&str> = doc.lines().collect();
    let mut start = 0usize;
    let mut parent_indent: Option<usize> = None;
    let mut found = None;
    for segment in path.iter().filter(|s| s.parse::<usize>().is_err()) {
        let mut hit = None;
        // Only keys at the block's own indentation are its children.
        let mut child_indent: Option<usize> = None;
        for (i, line) in lines.iter().enumerate().skip(start) {
            let body = line.trim_start_matches([' ', '-']);
            let indent = line.len() - body.len();
            if body.is_empty() || body.starts_with('#') {
                continue;
            }
            if let Some(p) = parent_indent {
                // Left the parent's block.
                if indent <= p {
                    break;
                }
            }
            if *child_indent.get_or_insert(indent) != indent {
                continue;
            }
            let key = body.strip_prefix(segment).and_then(|rest| {
                let rest = rest.trim_start_matches(['"', '\'']);
                rest.starts_with(':').then_some(())
            });
            let quoted = body
                .strip_prefix('"')
                .or_else(|| body.strip_prefix('\''))
                .and_then(|b| b.strip_prefix(segment))
                .is_some();
            if key.is_some() || quoted {
                hit = Some((i, indent));
                break;
            }
        }
        let (i, indent) = hit?;
        found = Some(((i + 1) as u64, (indent + 1) as u64));
        start = i + 1;
        parent_indent = Some(indent);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "apiVersion: v1\nkind: X\nmetadata:\n  name: a\n  namespace: prod\nspec:\n  replicas: 3\n  steps:\n  - 1\n  template:\n    metadata:\n      name: inner\n";

    #[test]
    fn finds_nested_keys_by_indentation() {
        assert_eq!(find_key(DOC, &["metadata", "namespace"]), Some((5, 3)));
        assert_eq!(find_key(DOC, &["spec", "steps"]), Some((8, 3)));
        assert_eq!(
            find_key(DOC, &["spec", "template", "metadata", "name"]),
            Some((12, 7))
        );
    }

    #[test]
    fn does_not_leave_the_parent_block() {
        // `name` exists under metadata, not under spec.
        assert_eq!(find_key(DOC, &["spec", "name"]), None);
    }

    #[test]
    fn skips_list_indices() {
        assert_eq!(find_key(DOC, &["spec", "steps", "0"]), Some((8, 3)));
    }
}
