//! What `vrange top` needs to fit the terminal, as top(1) does: [`columns`] and [`fit`]; and
//! nouns counted in the number they take ([`count`]). Printing itself is vrange-print's.

/// The width to fit lines to, as top(1) reads it: `COLUMNS` when it is set to a positive
/// number, else the terminal's width when standard output is a terminal (TIOCGWINSZ); `None`
/// (do not cut) for a pipe or file without `COLUMNS`.
pub fn columns() -> Option<usize> {
    use std::io::IsTerminal;
    if let Some(n) = std::env::var("COLUMNS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        return Some(n);
    }
    if !std::io::stdout().is_terminal() {
        return None;
    }
    match crossterm::terminal::size() {
        Ok((cols, _)) if cols > 0 => Some(usize::from(cols)),
        _ => None,
    }
}

/// `text` with every line cut to `width` characters (none is cut when `width` is `None`).
pub fn fit(text: &str, width: Option<usize>) -> String {
    let Some(width) = width else {
        return text.to_string();
    };
    let mut s = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, newline) = match line.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (line, ""),
        };
        match body.char_indices().nth(width) {
            Some((cut, _)) => s.push_str(body[..cut].trim_end()),
            None => s.push_str(body),
        }
        s.push_str(newline);
    }
    s
}

/// `n` and a noun in the number it takes: "1 allocation", "2 allocations", "0 processes"
/// (`many` for the irregular plurals; `None`: the noun and an s).
pub fn count(n: impl Into<u128>, one: &str, many: Option<&str>) -> String {
    let n = n.into();
    match (n, many) {
        (1, _) => format!("{n} {one}"),
        (_, Some(many)) => format!("{n} {many}"),
        (_, None) => format!("{n} {one}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::{count, fit};

    #[test]
    fn one_is_singular() {
        assert_eq!(count(1u64, "allocation", None), "1 allocation");
        assert_eq!(count(0u64, "allocation", None), "0 allocations");
        assert_eq!(count(2u32, "process", Some("processes")), "2 processes");
        assert_eq!(count(1u32, "process", Some("processes")), "1 process");
    }

    #[test]
    fn fit_cuts_each_line_to_the_width() {
        let text = "0123456789\nshort\n–––––––––––\nno newline at the end";
        assert_eq!(fit(text, Some(5)), "01234\nshort\n–––––\nno ne");
        assert_eq!(fit(text, None), text);
        assert_eq!(fit("ab   cd\n", Some(4)), "ab\n", "no trailing blanks");
    }
}
