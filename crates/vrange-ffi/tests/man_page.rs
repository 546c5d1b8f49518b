//! vrange(3), `docs/man/vrange.3`, is generated from the man-page comment at the top of
//! `include/vrange.h`, so the two cannot drift: this test converts the comment to troff and
//! fails when the committed page differs. After changing the comment, regenerate the page with
//!
//!     VRANGE_UPDATE_MAN=1 cargo test -p vrange-ffi --test man_page
//!
//! The comment's layout is the grammar (" * " stripped, then by indentation):
//! - column 1: a section (`NAME`); column 3: a subsection (`Regions`);
//! - column 5: a paragraph; `- ` starts a list item (continued at column 7); `TAG  text`
//!   (two or more spaces) or `TAG` alone followed by deeper lines is a tagged paragraph
//!   (`EINVAL`, `VRANGE_LAZY`, an environment variable), its body the deeper lines;
//! - a paragraph that starts deeper than column 5 after a blank line is verbatim, and so is
//!   every paragraph of SYNOPSIS and EXAMPLE that does not start with a capitalised word.

// ci: host only: compares the man page with the header

use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/vrange-ffi lies two levels below the repository root")
        .to_path_buf()
}

/// The lines of the header's first comment from its NAME section on, " *" and one space
/// stripped, so that sections start at column 1 as in the header.
fn comment_lines(header: &str) -> Vec<&str> {
    let body: Vec<&str> = header
        .lines()
        .skip_while(|l| l.trim() != "/*")
        .skip(1)
        .take_while(|l| l.trim() != "*/")
        .map(|l| l.strip_prefix(" *").unwrap_or(l))
        .collect();
    let name = body
        .iter()
        .position(|l| *l == " NAME")
        .expect("vrange.h's comment has a NAME section");
    body[name..].to_vec()
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Escapes text for troff: backslashes, and a control character at the start of a line.
fn escape(text: &str) -> String {
    let text = text.replace('\\', "\\e");
    if text.starts_with('.') || text.starts_with('\'') {
        format!("\\&{text}")
    } else {
        text
    }
}

/// Escapes and formats running text: function names, page references (`madvise(2)`) and
/// constants (`VRANGE_LAZY`, `MADV_FREE`) in bold, option dashes and minus signs as `\-`.
fn prose(text: &str) -> String {
    let text = escape(text);
    let mut out = String::with_capacity(text.len() + 16);
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let word_start = i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        if word_start && (c.is_alphabetic() || c == '_') {
            let end = (i..chars.len())
                .find(|&j| !(chars[j].is_alphanumeric() || chars[j] == '_'))
                .unwrap_or(chars.len());
            let word: String = chars[i..end].iter().collect();
            let rest: String = chars[end..].iter().take(3).collect();
            let is_call = rest.starts_with("()")
                || (rest.len() == 3
                    && rest.starts_with('(')
                    && rest.ends_with(')')
                    && rest.as_bytes()[1].is_ascii_digit());
            let is_constant = word.contains('_')
                && word.chars().any(|c| c.is_ascii_uppercase())
                && !word.chars().any(|c| c.is_ascii_lowercase());
            if is_call || is_constant {
                out.push_str(&format!("\\fB{word}\\fP"));
            } else {
                out.push_str(&word);
            }
            i = end;
            continue;
        }
        let next_is_word = chars.get(i + 1).is_some_and(|n| n.is_alphanumeric());
        if c == '-' && next_is_word && (i == 0 || chars[i - 1] == ' ' || chars[i - 1] == '(') {
            out.push_str("\\-");
        } else {
            out.push(c);
        }
        i += 1;
    }
    out
}

/// Verbatim lines, indented relative to `base`.
fn verbatim(out: &mut String, lines: &[&str], base: usize) {
    out.push_str(".PP\n.RS\n.nf\n");
    for line in lines {
        let text = line.get(base..).unwrap_or("").trim_end();
        out.push_str(&escape(text));
        out.push('\n');
    }
    out.push_str(".fi\n.RE\n");
}

/// Splits `TAG  text` at its first run of two or more spaces.
fn inline_tag(line: &str) -> Option<(&str, &str)> {
    let text = line.trim();
    let gap = text.find("  ")?;
    Some((&text[..gap], text[gap..].trim_start()))
}

fn to_troff(lines: &[&str]) -> String {
    let mut out = format!(
        ".\\\" Generated from the comment at the top of include/vrange.h by\n\
         .\\\" crates/vrange-ffi/tests/man_page.rs; edit the header, then regenerate with\n\
         .\\\" VRANGE_UPDATE_MAN=1 cargo test -p vrange-ffi --test man_page\n\
         .TH VRANGE 3 \"\" \"vrange {}\" \"Library Functions Manual\"\n\
         .nh\n",
        env!("CARGO_PKG_VERSION")
    );
    let mut section = "";
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let depth = indent(line);
        if line.trim().is_empty() {
            i += 1;
            continue;
        }
        if depth <= 1 {
            section = line.trim();
            out.push_str(&format!(".SH {section}\n"));
            i += 1;
            continue;
        }
        if depth <= 3 {
            out.push_str(&format!(".SS \"{}\"\n", prose(line.trim())));
            i += 1;
            continue;
        }
        // The lines of this paragraph: up to a blank line or a heading.
        let end = (i..lines.len())
            .find(|&j| lines[j].trim().is_empty() || indent(lines[j]) <= 3)
            .unwrap_or(lines.len());
        let para = &lines[i..end];
        if section == "NAME" {
            let joined: Vec<&str> = para.iter().map(|l| l.trim()).collect();
            let name = joined.join(" ").replacen(" - ", " \\- ", 1);
            out.push_str(&format!("{name}\n"));
        } else if section == "SYNOPSIS" || section == "EXAMPLE" {
            let first = para[0].trim();
            let capitalised = first.chars().next().is_some_and(char::is_uppercase)
                && first
                    .split(' ')
                    .next()
                    .is_some_and(|w| w.chars().skip(1).all(char::is_lowercase));
            if capitalised {
                plain(&mut out, para);
            } else {
                verbatim(&mut out, para, 5);
            }
        } else if depth > 5 {
            verbatim(&mut out, para, 5);
        } else {
            structured(&mut out, para);
        }
        i = end;
    }
    out
}

/// A filled paragraph.
fn plain(out: &mut String, para: &[&str]) {
    out.push_str(".PP\n");
    for line in para {
        out.push_str(&prose(line.trim()));
        out.push('\n');
    }
}

/// A paragraph at column 5 that may hold list items and tagged paragraphs.
fn structured(out: &mut String, para: &[&str]) {
    let mut i = 0;
    let mut in_text = false;
    while i < para.len() {
        let line = para[i];
        let deeper = |j: usize| para.get(j).is_some_and(|l| indent(l) > 5);
        // The continuation of an item: the following deeper lines.
        let body_end = (i + 1..para.len())
            .find(|&j| !deeper(j))
            .unwrap_or(para.len());
        if let Some(item) = line.trim().strip_prefix("- ") {
            out.push_str(".IP \\(bu 2\n");
            out.push_str(&prose(item));
            out.push('\n');
        } else if let Some((tag, text)) = inline_tag(line) {
            out.push_str(&format!(".TP\n.B \"{}\"\n{}\n", escape(tag), prose(text)));
        } else if deeper(i + 1) {
            out.push_str(&format!(".TP\n.B \"{}\"\n", escape(line.trim())));
        } else {
            if !in_text {
                out.push_str(".PP\n");
            }
            out.push_str(&prose(line.trim()));
            out.push('\n');
            in_text = true;
            i += 1;
            continue;
        }
        for body in &para[i + 1..body_end] {
            out.push_str(&prose(body.trim()));
            out.push('\n');
        }
        in_text = false;
        i = body_end;
    }
}

#[test]
fn man_page_matches_the_header() {
    let root = repo_root();
    let header = std::fs::read_to_string(root.join("include/vrange.h")).unwrap();
    let page = to_troff(&comment_lines(&header));
    let path = root.join("docs/man/vrange.3");
    if std::env::var_os("VRANGE_UPDATE_MAN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &page).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == page,
        "{} is not what include/vrange.h's comment gives; regenerate it with\n    \
         VRANGE_UPDATE_MAN=1 cargo test -p vrange-ffi --test man_page",
        path.display()
    );
}
