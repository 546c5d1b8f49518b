//! What every suite prints and writes: tables (the command's one [`Table`] type: aligned text
//! on stdout, Markdown in the suite's report file), CSV files in the output directory,
//! progress lines on stderr (only when stderr is a terminal, so logs and tests see the tables
//! alone), and the number formats the tables share.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

pub use crate::table::Table;

/// A progress line on stderr, when stderr is a terminal.
pub fn progress(line: impl AsRef<str>) {
    if std::io::stderr().is_terminal() {
        eprintln!("{}", line.as_ref());
    }
}

/// A CSV file: raw numbers (not the table's rounded text), one header line.
pub struct Csv {
    text: String,
    columns: usize,
}

impl Csv {
    pub fn new(columns: &[&str]) -> Csv {
        Csv {
            text: format!("{}\n", columns.join(",")),
            columns: columns.len(),
        }
    }

    /// A row with only its leading cells and a note in the last column (a skipped or failed
    /// measurement): the cells in between stay empty.
    pub fn note(&mut self, lead: &[&str], note: &str) {
        let blanks = self.columns.saturating_sub(lead.len() + 1);
        let cells = lead
            .iter()
            .copied()
            .chain(std::iter::repeat_n("", blanks))
            .chain([note]);
        self.row(cells);
    }

    pub fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let cells: Vec<String> = cells.into_iter().map(|c| field(c.as_ref())).collect();
        let _ = writeln!(self.text, "{}", cells.join(","));
    }

    /// Writes `dir/name` and says where on stdout.
    pub fn write(&self, dir: &Path, name: &str) -> Result<PathBuf, String> {
        write_file(dir, name, &self.text)
    }
}

/// Writes `dir/name`; the suites report the paths they wrote under their tables.
pub fn write_file(dir: &Path, name: &str, text: &str) -> Result<PathBuf, String> {
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(path)
}

fn field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// An optional number for a CSV cell: empty when absent.
pub fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or(String::new(), |x| format!("{x:.digits$}"))
}

/// The median of `v` (sorted in place); `None` when empty.
pub fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Three significant digits.
fn sig3(v: f64) -> String {
    let digits = if v >= 100.0 {
        0
    } else if v >= 10.0 {
        1
    } else {
        2
    };
    format!("{v:.digits$}")
}

/// "1.23 µs": a duration in nanoseconds with a unit.
pub fn ns(ns: f64) -> String {
    scaled(ns, [" s", " ms", " µs", " ns"])
}

/// "3.57 G": a rate with a decimal prefix.
pub fn rate(x: f64) -> String {
    scaled(x, [" G", " M", " k", ""])
}

/// `x` in three significant digits and the unit of its power of 1000: `units` for 10⁹, 10⁶,
/// 10³ and 1.
fn scaled(x: f64, units: [&str; 4]) -> String {
    let (v, unit) = [1e9, 1e6, 1e3]
        .into_iter()
        .zip(units)
        .find(|&(scale, _)| x >= scale)
        .map_or((x, units[3]), |(scale, unit)| (x / scale, unit));
    format!("{}{unit}", sig3(v))
}

/// "96 MiB": whole MiB of `bytes`.
pub fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

/// "97.3 %": a fraction in percent.
pub fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

/// "4KiB", "2MiB", "1GiB".
pub fn size(bytes: usize) -> String {
    const KIB: usize = 1 << 10;
    if bytes >= 1 << 30 && bytes % (1 << 30) == 0 {
        format!("{}GiB", bytes >> 30)
    } else if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{}MiB", bytes >> 20)
    } else {
        format!("{}KiB", bytes / KIB)
    }
}

/// "102,640 kB": thousands separated, as the kernel's patch letters write them.
pub fn kb(kb: u64) -> String {
    format!("{} kB", thousands(&kb.to_string()))
}

/// "102,640": a string of digits with thousands separated.
pub fn thousands(digits: &str) -> String {
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// "1.23×".
pub fn times(x: Option<f64>) -> String {
    x.map_or("–".to_string(), |x| {
        if x >= 100.0 {
            format!("{x:.0}×")
        } else {
            format!("{x:.2}×")
        }
    })
}

/// The runs of one configuration at one thread count, or why they stopped.
pub struct Cell<R> {
    pub runs: Vec<R>,
    pub failed: Option<String>,
}

impl<R> Default for Cell<R> {
    fn default() -> Self {
        Cell {
            runs: Vec::new(),
            failed: None,
        }
    }
}

impl<R> Cell<R> {
    /// The median of `f` over the runs; `None` when a run failed or none ran.
    pub fn median(&self, f: impl Fn(&R) -> f64) -> Option<f64> {
        if self.failed.is_some() {
            return None;
        }
        median(&mut self.runs.iter().map(f).collect::<Vec<_>>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(kb(102640), "102,640 kB");
        assert_eq!(kb(248), "248 kB");
        assert_eq!(ns(80.1), "80.1 ns");
        assert_eq!(ns(1_390.0), "1.39 µs");
        assert_eq!(ns(590_000_000.0), "590 ms");
        assert_eq!(rate(3.52e9), "3.52 G");
        assert_eq!(size(4096), "4KiB");
        assert_eq!(size(2 << 20), "2MiB");
        assert_eq!(size(1 << 30), "1GiB");
    }

    #[test]
    fn csv_quoting_and_medians() {
        assert_eq!(field("x,y"), "\"x,y\"");
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&mut []), None);
    }
}
