//! The one table type of the `vrange` command and of vrange-bench's reports: aligned plain text
//! for the terminal, Markdown for files. Column widths are computed from the cells; a column whose cells are numbers
//! (they start with a digit, or are a placeholder such as "–") is right-aligned, so that
//! magnitudes line up. `vrange stat --watch` prints one row at a time with the same layout
//! ([`Layout`]), its widths fixed from the header and the first row.

use std::fmt::Write as _;

/// Columns are separated by this many spaces.
const GAP: usize = 2;

/// A table printed whole once filled.
pub struct Table {
    headers: Vec<String>,
    /// Each row's cells, padded to the header's length, and how many were given: a row with
    /// fewer cells than columns is a note (skipped, failed) whose last cell may run on past its
    /// column, so it does not widen that column on the terminal.
    rows: Vec<(Vec<String>, usize)>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Table {
        Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are left empty, extra ones are a bug.
    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert!(cells.len() <= self.headers.len(), "{cells:?}");
        let given = cells.len();
        let mut cells = cells;
        cells.resize(self.headers.len(), String::new());
        self.rows.push((cells, given));
    }
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "| {} |", self.headers.join(" | "));
        let _ = writeln!(s, "|{}", "---|".repeat(self.headers.len()));
        for (r, _) in &self.rows {
            let cells: Vec<String> = r.iter().map(|c| c.replace('|', "\\|")).collect();
            let _ = writeln!(s, "| {} |", cells.join(" | "));
        }
        s
    }

    /// The cells of column `c` that count for its width and alignment (not a note's last).
    fn column(&self, c: usize) -> impl Iterator<Item = &str> {
        let n = self.headers.len();
        self.rows
            .iter()
            .filter(move |(_, given)| c + 1 < *given || (c < *given && *given == n))
            .map(move |(r, _)| r[c].as_str())
    }

    /// The layout that fits every cell.
    pub fn layout(&self) -> Layout {
        let columns = (0..self.headers.len())
            .map(|c| {
                let width = self
                    .column(c)
                    .chain([self.headers[c].as_str()])
                    .map(width)
                    .max()
                    .unwrap_or(0);
                (width, numeric(self.column(c)))
            })
            .collect();
        Layout { columns }
    }

    /// Aligned plain text: the header, a rule of dashes under each column, the rows.
    pub fn to_text(&self) -> String {
        let layout = self.layout();
        let mut s = layout.header(&self.headers);
        for (r, given) in &self.rows {
            s.push_str(&layout.line(&r[..*given]));
        }
        s
    }

    /// Prints the table as aligned text, after a blank line.
    pub fn print(&self) {
        println!("\n{}", self.to_text());
    }
}

/// Fixed column widths and alignments, for tables printed a row at a time.
pub struct Layout {
    /// Width in characters and whether the column is right-aligned.
    columns: Vec<(usize, bool)>,
}

impl Layout {
    /// Every column at least `min` characters wide, for rows still to come.
    pub fn widen(mut self, min: usize) -> Layout {
        for (w, _) in &mut self.columns {
            *w = (*w).max(min);
        }
        self
    }

    /// The header line and the rule under it.
    pub fn header<S: AsRef<str>>(&self, headers: &[S]) -> String {
        let rule: Vec<String> = self.columns.iter().map(|&(w, _)| "-".repeat(w)).collect();
        format!("{}{}", self.line(headers), self.line(&rule))
    }

    /// One line: each cell padded to its column; a last cell in a column it does not fill
    /// (fewer cells than columns) is written as it is. Ends with a newline, never with spaces.
    pub fn line<S: AsRef<str>>(&self, cells: &[S]) -> String {
        let mut s = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let cell = cell.as_ref();
            if i > 0 {
                s.push_str(&" ".repeat(GAP));
            }
            let Some(&(w, right)) = self.columns.get(i) else {
                s.push_str(cell);
                continue;
            };
            let pad = " ".repeat(w.saturating_sub(width(cell)));
            let note = i + 1 == cells.len() && cells.len() < self.columns.len();
            if right && !note {
                s.push_str(&pad);
                s.push_str(cell);
            } else {
                s.push_str(cell);
                s.push_str(&pad);
            }
        }
        let mut s = s.trim_end().to_string();
        s.push('\n');
        s
    }
}

/// Width on a terminal: one column per character (the tables use no wide characters).
fn width(s: &str) -> usize {
    s.chars().count()
}

/// Whether a column holds numbers: every cell is empty, a placeholder ("–", "?") or starts
/// with a digit, and not every cell is empty.
fn numeric<'a>(cells: impl Iterator<Item = &'a str>) -> bool {
    let mut any = false;
    for c in cells {
        let c = c.trim_start_matches(['-', '+', '~', '≈']);
        match c.chars().next() {
            None => {}
            Some(d) if d.is_ascii_digit() => any = true,
            Some(_) if matches!(c, "–" | "?" | "-") => any = true,
            Some(_) => return false,
        }
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_keeps_empty_cells() {
        let mut t = Table::new(&["a", "b"]);
        t.row(vec!["1".into()]);
        assert_eq!(t.to_markdown(), "| a | b |\n|---|---|\n| 1 |  |\n");
    }

    #[test]
    fn text_is_aligned_numbers_right() {
        let mut t = Table::new(&["size", "time", "note"]);
        t.row(vec!["4KiB".into(), "80.1 ns".into(), "ok".into()]);
        t.row(vec!["64MiB".into(), "5.58 ms".into(), "slow".into()]);
        t.row(vec!["1GiB".into(), "–".into(), "x".into()]);
        t.row(vec![
            "2MiB".into(),
            "skipped: a reason far longer than the column".into(),
        ]);
        assert_eq!(
            t.to_text(),
            " size     time  note\n\
             -----  -------  ----\n\
             \x204KiB  80.1 ns  ok\n\
             64MiB  5.58 ms  slow\n\
             \x201GiB        –  x\n\
             \x202MiB  skipped: a reason far longer than the column\n"
        );
    }

    #[test]
    fn words_are_left_aligned_and_lines_never_end_in_spaces() {
        let mut t = Table::new(&["allocator", "config"]);
        t.row(vec!["glibc".into(), "default".into()]);
        t.row(vec!["vrange-malloc".into(), "".into()]);
        let text = t.to_text();
        assert!(text.starts_with("allocator      config\n"), "{text}");
        assert!(text.lines().all(|l| !l.ends_with(' ')), "{text}");
        assert!(text.contains("\nglibc          default\n"), "{text}");
    }

    #[test]
    fn a_widened_layout_keeps_later_rows_aligned() {
        let mut t = Table::new(&["time", "RSS"]);
        t.row(vec!["12:00:01".into(), "2.5".into()]);
        let l = t.layout().widen(6);
        assert_eq!(
            l.header(&["time", "RSS"]),
            "    time     RSS\n--------  ------\n"
        );
        assert_eq!(l.line(&["12:00:02", "1024.5"]), "12:00:02  1024.5\n");
        assert_eq!(l.line(&["12:00:03", "gone"]), "12:00:03    gone\n");
    }
}
