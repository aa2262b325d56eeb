//! Columns sized to their content, as kubectl prints them: every column as wide as its widest
//! cell, two spaces between columns, the last one never padded.

/// Rows of cells under a header; [`Table::render`] pads them.
#[derive(Clone, Debug, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table whose first row is `header`.
    pub fn new(header: &[&str]) -> Table {
        Table {
            rows: vec![header.iter().map(|h| h.to_string()).collect()],
        }
    }

    /// Adds a row; control characters in cells become spaces (cells come from the cluster,
    /// and an escape sequence there must not reach the terminal).
    pub fn push(&mut self, cells: Vec<String>) {
        self.rows
            .push(cells.into_iter().map(|c| printable(&c)).collect());
    }

    /// The rows as lines, each ending in a newline.
    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|i| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(i))
                    .map(|c| c.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                line.push_str(cell);
                if i + 1 < row.len() {
                    let pad = widths[i] - cell.chars().count() + 2;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `text` without control characters.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let mut t = Table::new(&["NAME", "KIND", "AGE"]);
        t.push(vec![
            "├── web-6f9c8d7b5-x2k4q".into(),
            "Pod".into(),
            "3m".into(),
        ]);
        t.push(vec!["web".into(), "CanaryDeployment".into(), "1h".into()]);
        assert_eq!(
            t.render(),
            "NAME                     KIND              AGE\n\
             ├── web-6f9c8d7b5-x2k4q  Pod               3m\n\
             web                      CanaryDeployment  1h\n"
        );
    }

    #[test]
    fn an_escape_sequence_in_a_cell_never_reaches_the_terminal() {
        let mut t = Table::new(&["A", "B"]);
        t.push(vec!["x\x1b[2Jy".into(), "z".into()]);
        assert!(!t.render().contains('\x1b'));
    }
}
