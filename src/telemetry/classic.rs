//! The metrics in Prometheus's classic text format (0.0.4), for a client that does not ask
//! for OpenMetrics: `promtool check metrics`, `curl`, older scrapers. prometheus-client
//! writes only OpenMetrics, where a counter's HELP and TYPE name the family (`x`) and its
//! samples `x_total`; a classic reader takes `x_total` for a family with no HELP.

use std::collections::HashSet;

/// What a request's `Accept` header asks for: OpenMetrics only when it names it, as
/// Prometheus's scrapes do.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// `openmetrics` (prometheus-client's encoding) in the classic text format: counters' HELP
/// and TYPE on their `_total` name, no UNIT lines, no `# EOF`.
pub fn to_classic(openmetrics: &str) -> String {
    let counters: HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .filter(|(_, kind)| *kind == "counter")
        .map(|(name, _)| name)
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta.and_then(|(p, rest)| Some((p, rest.split_once(' ')?))) {
            Some((prefix, (name, rest))) if counters.contains(name) => {
                out.push_str(&format!("{prefix}{name}_total {rest}"));
            }
            Some(("# TYPE ", (name, "unknown"))) => {
                out.push_str(&format!("# TYPE {name} untyped"));
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counters_help_and_type_name_its_samples() {
        let om = "# HELP linnet_sync_errors Failed steps.\n# TYPE linnet_sync_errors counter\nlinnet_sync_errors_total{reason=\"git\"} 0\n# HELP linnet_leader 1 when acting.\n# TYPE linnet_leader gauge\nlinnet_leader 1\n# HELP linnet_resident_memory_bytes VmRSS.\n# TYPE linnet_resident_memory_bytes gauge\n# UNIT linnet_resident_memory_bytes bytes\nlinnet_resident_memory_bytes 1024\n# EOF\n";
        assert_eq!(
            to_classic(om),
            "# HELP linnet_sync_errors_total Failed steps.\n# TYPE linnet_sync_errors_total counter\nlinnet_sync_errors_total{reason=\"git\"} 0\n# HELP linnet_leader 1 when acting.\n# TYPE linnet_leader gauge\nlinnet_leader 1\n# HELP linnet_resident_memory_bytes VmRSS.\n# TYPE linnet_resident_memory_bytes gauge\nlinnet_resident_memory_bytes 1024\n"
        );
    }

    #[test]
    fn openmetrics_only_when_asked_for() {
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
        )));
        assert!(!wants_openmetrics(Some("text/plain")));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(None));
    }
}
