//! What the log has said of errors that persist: a retry that meets the same error again says
//! nothing new, so each error is logged when it starts or changes, and once when it is gone.
//! Pure.

use std::collections::BTreeMap;

/// The errors last logged, by what they are about (an object, a file).
#[derive(Debug, Default)]
pub struct SaidErrors {
    last: BTreeMap<String, String>,
}

/// What changed since the errors were last logged.
#[derive(Debug, Default, PartialEq)]
pub struct News {
    /// New errors, or errors whose message changed: (about, message).
    pub changed: Vec<(String, String)>,
    /// What had an error and has none now.
    pub cleared: Vec<String>,
}

impl SaidErrors {
    /// Takes the errors as they are now (all of them), and says what is news. Holds at most
    /// `limit` errors: beyond it, errors are counted by the caller, not logged one by one.
    pub fn news(&mut self, now: impl IntoIterator<Item = (String, String)>, limit: usize) -> News {
        let now: BTreeMap<String, String> = now.into_iter().take(limit).collect();
        let changed = now
            .iter()
            .filter(|(about, message)| self.last.get(*about) != Some(*message))
            .map(|(a, m)| (a.clone(), m.clone()))
            .collect();
        let cleared = self
            .last
            .keys()
            .filter(|about| !now.contains_key(*about))
            .cloned()
            .collect();
        self.last = now;
        News { changed, cleared }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(a, m)| (a.to_string(), m.to_string()))
            .collect()
    }

    #[test]
    fn an_error_is_news_when_it_starts_changes_or_ends() {
        let mut said = SaidErrors::default();
        let first = said.news(errors(&[("svc", "403"), ("cm", "422")]), 100);
        assert_eq!(first.changed.len(), 2);
        assert!(first.cleared.is_empty());
        assert_eq!(
            said.news(errors(&[("svc", "403"), ("cm", "422")]), 100),
            News::default(),
            "the same errors again are no news"
        );
        assert_eq!(
            said.news(errors(&[("svc", "404")]), 100),
            News {
                changed: errors(&[("svc", "404")]),
                cleared: vec!["cm".into()],
            }
        );
        assert_eq!(
            said.news(Vec::new(), 100),
            News {
                changed: Vec::new(),
                cleared: vec!["svc".into()],
            }
        );
    }

    #[test]
    fn only_the_first_errors_up_to_the_limit_are_held() {
        let mut said = SaidErrors::default();
        let many: Vec<(String, String)> =
            (0..1000).map(|i| (format!("o{i}"), "e".into())).collect();
        assert_eq!(said.news(many.clone(), 10).changed.len(), 10);
        assert_eq!(said.news(many, 10), News::default());
    }
}
