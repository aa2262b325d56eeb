//! What one spec file may cost to parse. Whoever can push to the repository controls these
//! bytes, and YAML lets a few kilobytes stand for gigabytes (aliases of aliases, merge keys).
//! The parser's own limits bound each document before anything is built (depth, raw nodes,
//! alias replays, merge keys); [`Allowance`] then charges every node and byte of the
//! *expanded* document as it is built, shared by all documents of a file, so a file over its
//! budget stops at the first node past it: memory stays near the budget whatever the content.

use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// The most one file may expand to. Large real manifests (a CRD with its whole schema) stay
/// far below: the biggest upstream CRDs are about 40,000 nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseBudget {
    /// Nodes (mappings, sequences, scalars) of the expanded file, every alias use counted.
    pub max_nodes: usize,
    /// Bytes of keys and scalars of the expanded file, every alias use counted.
    pub max_bytes: usize,
    /// Nesting of mappings and sequences.
    pub max_depth: usize,
    /// Alias uses (`*name`) per file.
    pub max_aliases: usize,
    /// Parser events a document may replay for aliases and merge keys, or record for
    /// anchors: the parser buffers these, at about a hundred bytes each.
    pub max_replayed_events: usize,
}

impl Default for ParseBudget {
    fn default() -> Self {
        ParseBudget {
            max_nodes: 100_000,
            max_bytes: 8 * 1024 * 1024,
            max_depth: 64,
            max_aliases: 10_000,
            max_replayed_events: 50_000,
        }
    }
}

/// What one revision's file listing may hold (issue 45): a tree of 1,000 entries that each
/// name another tree of 1,000 entries is a million paths from 100 KB pushed. Charged per
/// directory, so that one bad subtree blocks itself, never its neighbours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RevisionShape {
    /// Files a revision may list (`--max-files`); past it the largest directories are
    /// blocked, each as one error, until the rest fits.
    pub max_files: usize,
    /// Entries one directory may hold (`--max-tree-entries`); a larger one is blocked.
    pub max_tree_entries: usize,
}

impl RevisionShape {
    /// Tree entries the diff of two revisions may look at before the revision is listed
    /// whole: twice the two versions of a directory at the entry limit (the trees on the
    /// changed path come on top), and never under 20,000. A one-file push to 10,000 files in
    /// one directory compares 20,002 entries.
    pub fn max_diff_entries(&self) -> usize {
        self.max_tree_entries.saturating_mul(4).max(20_000)
    }
}

impl Default for RevisionShape {
    fn default() -> Self {
        RevisionShape {
            max_files: 10_000,
            max_tree_entries: 10_000,
        }
    }
}

/// What is left of a file's [`ParseBudget`] while its documents are parsed.
pub(crate) struct Allowance {
    budget: ParseBudget,
    nodes_left: Cell<usize>,
    bytes_left: Cell<usize>,
}

impl Allowance {
    pub(crate) fn new(budget: ParseBudget) -> Allowance {
        Allowance {
            budget,
            nodes_left: Cell::new(budget.max_nodes),
            bytes_left: Cell::new(budget.max_bytes),
        }
    }

    fn charge<E: serde::de::Error>(&self, bytes: usize) -> Result<(), E> {
        let nodes = self.nodes_left.get();
        if nodes == 0 {
            return Err(E::custom(format!(
                "{OVER}: the file expands to more than {} nodes (each use of an alias counts \
                 again)",
                self.budget.max_nodes
            )));
        }
        let Some(left) = self.bytes_left.get().checked_sub(bytes) else {
            return Err(E::custom(format!(
                "{OVER}: the file expands to more than {} bytes of keys and values (each use \
                 of an alias counts again)",
                self.budget.max_bytes
            )));
        };
        self.nodes_left.set(nodes - 1);
        self.bytes_left.set(left);
        Ok(())
    }

    /// Parser options for the next document: its raw size and alias replays bounded by what
    /// the file has left, so the parser refuses a bomb before it buffers it.
    pub(crate) fn parser_options(&self) -> serde_saphyr::Options {
        let nodes = self.nodes_left.get().max(1);
        let replayed = nodes
            .saturating_mul(2)
            .saturating_add(16)
            .min(self.budget.max_replayed_events);
        serde_saphyr::options! {
            budget: serde_saphyr::budget! {
                max_depth: self.budget.max_depth,
                max_nodes: nodes,
                max_events: nodes.saturating_mul(2).saturating_add(16),
                max_aliases: self.budget.max_aliases,
                max_anchors: self.budget.max_aliases,
                max_merge_keys: self.budget.max_aliases,
                max_total_scalar_bytes: self.bytes_left.get().max(1),
                max_recorded_anchor_events: replayed,
                max_recorded_anchor_bytes: self.bytes_left.get().max(1),
            },
            alias_limits: serde_saphyr::alias_limits! {
                max_total_replayed_events: replayed,
                max_replay_stack_depth: 16,
            },
        }
    }

    /// Parses one document into a JSON value, charging this allowance for every node built.
    pub(crate) fn parse(&self, text: &str) -> Result<Value, serde_saphyr::Error> {
        serde_saphyr::with_deserializer_from_str_with_options(text, self.parser_options(), |de| {
            Charged(self).deserialize(de)
        })
    }
}

/// The start of every over-budget message, so callers can tell them apart.
pub(crate) const OVER: &str = "over the parse budget";

/// A clear message for a parser error that is a refused budget, if it is one.
pub(crate) fn budget_refusal(err: &serde_saphyr::Error, budget: &ParseBudget) -> Option<String> {
    use serde_saphyr::Error as E;
    use serde_saphyr::budget::BudgetBreach as B;
    let mut err = err;
    while let E::AliasError { error, .. } | E::WithSnippet { error, .. } = err {
        err = error;
    }
    let why = match err {
        E::Budget { breach, .. } => match breach {
            B::Depth { .. } => format!(
                "mappings and sequences nest deeper than {} levels",
                budget.max_depth
            ),
            B::Aliases { .. } | B::Anchors { .. } | B::MergeKeys { .. } => format!(
                "the file uses more than {} aliases, anchors or merge keys",
                budget.max_aliases
            ),
            _ => format!(
                "the file expands to more than {} nodes or {} bytes (each use of an alias \
                 counts again)",
                budget.max_nodes, budget.max_bytes
            ),
        },
        E::AliasReplayLimitExceeded { .. }
        | E::AliasReplayStackDepthExceeded { .. }
        | E::AliasReplayCounterOverflow { .. } => format!(
            "the file's aliases expand to more than {} nodes (each use counts again)",
            budget.max_nodes
        ),
        other => {
            let text = other.to_string();
            if !text.contains(OVER) {
                return None;
            }
            text.lines()
                .next()
                .and_then(|l| l.split_once(OVER))
                .map(|(_, rest)| rest.trim_start_matches(": ").to_string())
                .unwrap_or(text)
        }
    };
    Some(format!(
        "{OVER}: {why}; split the file, or write out fewer aliases"
    ))
}

/// A [`Value`] deserializer that charges an [`Allowance`] before it builds each node.
#[derive(Clone, Copy)]
struct Charged<'a>(&'a Allowance);

impl<'de> DeserializeSeed<'de> for Charged<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Value, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Charged<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML value")
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Value, E> {
        self.0.charge(1)?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Value, E> {
        self.0.charge(8)?;
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Value, E> {
        self.0.charge(8)?;
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        self.0.charge(8)?;
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        self.0.charge(v.len())?;
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Value, E> {
        self.0.charge(v.len())?;
        Ok(Value::String(v))
    }

    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Value, E> {
        self.0.charge(v.len())?;
        Ok(Value::String(String::from_utf8_lossy(v).into_owned()))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        self.0.charge(0)?;
        Ok(Value::Null)
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, de: D) -> Result<Value, D::Error> {
        self.deserialize(de)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.0.charge(0)?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.0.charge(0)?;
        let mut out = Map::new();
        while let Some(key) = map.next_key_seed(Key(self.0))? {
            let value = map.next_value_seed(self)?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

/// A mapping key, charged like a string.
struct Key<'a>(&'a Allowance);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<String, D::Error> {
        de.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a mapping key")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<String, E> {
        self.0.charge(v.len())?;
        Ok(v.to_owned())
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<String, E> {
        self.0.charge(v.len())?;
        Ok(v)
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<String, E> {
        self.visit_string(v.to_string())
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<String, E> {
        self.visit_string(v.to_string())
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<String, E> {
        self.visit_string(v.to_string())
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<String, E> {
        self.visit_string(v.to_string())
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<String, E> {
        Err(E::custom("a mapping key may not be null"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> ParseBudget {
        ParseBudget {
            max_nodes: 1_000,
            max_bytes: 10_000,
            max_depth: 16,
            max_aliases: 100,
            max_replayed_events: 2_000,
        }
    }

    #[test]
    fn a_document_within_budget_parses_as_json_would() {
        let a = Allowance::new(small());
        let v = a.parse("a: 1\nb: [x, true, 2.5, ~]\n3: {c: d}\n").unwrap();
        assert_eq!(
            v,
            serde_json::json!({"a": 1, "b": ["x", true, 2.5, null], "3": {"c": "d"}})
        );
    }

    #[test]
    fn nested_aliases_stop_at_the_node_budget() {
        let bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n\
                    b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n\
                    c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n\
                    d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n";
        let e = Allowance::new(small()).parse(bomb).unwrap_err();
        let why = budget_refusal(&e, &small()).unwrap();
        assert!(why.contains("1000 nodes"), "{why}");
    }

    #[test]
    fn a_long_scalar_used_many_times_stops_at_the_byte_budget() {
        let long = "y".repeat(2_000);
        let text = format!("a: &a {long}\nb: [*a, *a, *a, *a, *a, *a]\n");
        let e = Allowance::new(small()).parse(&text).unwrap_err();
        let why = budget_refusal(&e, &small()).unwrap();
        assert!(why.contains("10000 bytes"), "{why}");
    }

    #[test]
    fn the_budget_is_shared_by_the_documents_of_a_file() {
        let a = Allowance::new(small());
        let doc = format!("k: [{}]\n", vec!["v"; 400].join(", "));
        assert!(a.parse(&doc).is_ok());
        assert!(a.parse(&doc).is_ok());
        assert!(a.parse(&doc).is_err());
    }

    #[test]
    fn merge_keys_count_what_they_copy() {
        let mut text = String::from("a: &a {");
        text.push_str(
            &(0..50)
                .map(|i| format!("k{i}: v"))
                .collect::<Vec<_>>()
                .join(", "),
        );
        text.push_str("}\n");
        for i in 0..40 {
            text.push_str(&format!("m{i}: {{<<: *a}}\n"));
        }
        assert!(Allowance::new(small()).parse(&text).is_err());
    }

    #[test]
    fn depth_is_bounded_by_the_parser() {
        let deep = format!("{}{}", "[".repeat(40), "]".repeat(40));
        assert!(Allowance::new(small()).parse(&deep).is_err());
    }
}
