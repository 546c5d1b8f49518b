//! The one grammar of vrange's settings, shared by the core's `VRANGE_*` variables and
//! `vrange::set_option`, vrange-malloc's `VRANGE_MALLOC_*` variables, the C
//! `vrange_set_option` and the `vrange` command's flags; and the one-line warning for a
//! malformed environment variable.
//!
//! Everything here works on bytes and never allocates: vrange-malloc reads its settings from
//! inside the first `malloc` of the process, before anything else has run.
//!
//! The values are parsed into `vrange::Config`, the typed form; this module only knows the
//! grammar. It lives in the OS layer because it reads the environment with getenv(3) and
//! warns with write(2), without allocating.
//!
//! # Grammar
//! - A size: optional whitespace, decimal digits, optional whitespace, an optional unit among
//!   `B`, `K`, `KB`, `KiB`, `M`, `MB`, `MiB`, `G`, `GB`, `GiB`, `T`, `TB`, `TiB` (any case),
//!   optional whitespace. Every unit is a power of 1024: `KB` means KiB here, as in jemalloc's
//!   `MALLOC_CONF` and ulimit. No sign, no fraction; a value that does not fit in 64 bits is
//!   an error.
//! - A number (milliseconds, percentages): the same without the unit.
//! - A switch: `on`/`off`, `yes`/`no`, `true`/`false`, `1`/`0`, any case, surrounding
//!   whitespace ignored.
//! - Other keywords (`auto`, `hybrid`, ...): any case, surrounding whitespace ignored.

use std::fmt;

/// Why [`parse_size`] or [`parse_number`] refused a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseSizeError {
    /// Nothing but whitespace.
    Empty,
    /// The value does not start with a decimal digit (a sign, a letter, a dot), or a number
    /// has something after its digits.
    NotANumber,
    /// Something other than a known unit follows the digits (`12Q`, `1.5G`).
    BadUnit,
    /// The value does not fit in 64 bits.
    Overflow,
}

impl fmt::Display for ParseSizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ParseSizeError::Empty => "empty value",
            ParseSizeError::NotANumber => "not a decimal number",
            ParseSizeError::BadUnit => "unknown unit (B, K, M, G, T, KiB, MiB, GiB, TiB)",
            ParseSizeError::Overflow => "too large",
        })
    }
}

impl std::error::Error for ParseSizeError {}

/// What a size looks like, for messages.
pub const SIZE_GRAMMAR: &str = "a size such as 4096, 64K, 64MiB or 2G";

/// Parses a size in bytes (see the module's grammar): `4096`, `64K`, `64 MiB`, `2g`.
///
/// # Errors
/// [`ParseSizeError`] says what is wrong; nothing is guessed.
pub fn parse_size(bytes: &[u8]) -> Result<u64, ParseSizeError> {
    let (n, unit) = split_number(bytes)?;
    let shift = match unit_shift(unit) {
        Some(s) => s,
        None => return Err(ParseSizeError::BadUnit),
    };
    n.checked_mul(1 << shift).ok_or(ParseSizeError::Overflow)
}

/// Parses a plain decimal number (milliseconds, percentages), surrounding whitespace allowed.
///
/// # Errors
/// As [`parse_size`]; anything after the digits is [`ParseSizeError::NotANumber`].
pub fn parse_number(bytes: &[u8]) -> Result<u64, ParseSizeError> {
    match split_number(bytes)? {
        (n, []) => Ok(n),
        _ => Err(ParseSizeError::NotANumber),
    }
}

/// The leading number of `bytes` (whitespace trimmed) and what follows it, trimmed.
fn split_number(bytes: &[u8]) -> Result<(u64, &[u8]), ParseSizeError> {
    let v = trim(bytes);
    if v.is_empty() {
        return Err(ParseSizeError::Empty);
    }
    let digits = v.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return Err(ParseSizeError::NotANumber);
    }
    let mut n: u64 = 0;
    for d in &v[..digits] {
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(d - b'0')))
            .ok_or(ParseSizeError::Overflow)?;
    }
    Ok((n, trim(&v[digits..])))
}

/// `bytes` without surrounding ASCII whitespace (`<[u8]>::trim_ascii` needs Rust 1.80).
fn trim(mut bytes: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = bytes {
        if !first.is_ascii_whitespace() {
            break;
        }
        bytes = rest;
    }
    while let [rest @ .., last] = bytes {
        if !last.is_ascii_whitespace() {
            break;
        }
        bytes = rest;
    }
    bytes
}

/// log2 of a unit's multiplier; `None` for an unknown unit.
fn unit_shift(unit: &[u8]) -> Option<u32> {
    let (letter, rest) = match unit.split_first() {
        None => return Some(0),
        Some((l, rest)) => (l.to_ascii_uppercase(), rest),
    };
    let shift = match letter {
        b'B' if rest.is_empty() => return Some(0),
        b'K' => 10,
        b'M' => 20,
        b'G' => 30,
        b'T' => 40,
        _ => return None,
    };
    (rest.is_empty() || rest.eq_ignore_ascii_case(b"B") || rest.eq_ignore_ascii_case(b"iB"))
        .then_some(shift)
}

/// What a switch looks like, for messages.
pub const SWITCH_GRAMMAR: &str = "on/off, yes/no, true/false, 1/0";

/// Parses a switch (see the module's grammar); `None` when the value is none of them.
pub fn parse_switch(bytes: &[u8]) -> Option<bool> {
    let v = trim(bytes);
    let is = |words: [&[u8]; 4]| words.iter().any(|w| v.eq_ignore_ascii_case(w));
    if is([b"on", b"yes", b"true", b"1"]) {
        Some(true)
    } else if is([b"off", b"no", b"false", b"0"]) {
        Some(false)
    } else {
        None
    }
}

/// Whether `bytes` is `word`, ignoring case and surrounding whitespace.
pub fn is_keyword(bytes: &[u8], word: &str) -> bool {
    trim(bytes).eq_ignore_ascii_case(word.as_bytes())
}

/// A byte count shown in the largest unit that divides it exactly (`64K`, `2G`, `1536K`,
/// `4097`), in the grammar [`parse_size`] reads back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
            if n != 0 && n.trailing_zeros() >= shift {
                return write!(f, "{}{unit}", n >> shift);
            }
        }
        write!(f, "{n}")
    }
}

/// The value of environment variable `name`, read with getenv(3): no allocation, no lock.
/// `None` when it is unset (or its name is absurdly long).
///
/// The bytes stay valid unless the program changes that variable, which it has no reason to
/// do; read each variable once and keep what was parsed, not the bytes.
pub fn var(name: &str) -> Option<&'static [u8]> {
    let mut buf = [0u8; 64];
    let name = name.as_bytes();
    debug_assert!(name.len() < buf.len() && !name.contains(&0));
    if name.len() >= buf.len() || name.contains(&0) {
        return None;
    }
    buf[..name.len()].copy_from_slice(name);
    // SAFETY: getenv reads the environment; buf holds the name and a terminating NUL.
    let p = unsafe { libc::getenv(buf.as_ptr().cast()) };
    // SAFETY: getenv returned a NUL-terminated string that outlives this call (or null).
    (!p.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes())
}

/// Reports a malformed (or clamped) environment variable on standard error, as one line:
/// `vrange: NAME=VALUE is not valid (ACCEPTED); using USED`.
///
/// Callers warn once per variable per process: each variable is read once. Written with one
/// write(2) from a stack buffer (no allocation, no lock, so safe inside malloc); a closed or
/// failing standard error is ignored. Bytes of the value that are not printable ASCII are
/// shown as `\xNN`, so the report stays one line, and a long value is cut short.
pub fn warn(name: &str, value: &[u8], accepted: &str, used: &dyn fmt::Display) {
    let line = warning(name, value, accepted, used);
    let out = line.bytes();
    // A failure (fd 2 closed, a reader gone) is ignored: a warning must never disturb the
    // program.
    crate::fd::write_stderr(out);
}

/// The line [`warn`] writes (at most 512 bytes).
fn warning(name: &str, value: &[u8], accepted: &str, used: &dyn fmt::Display) -> StackText<512> {
    const VALUE_MAX: usize = 96;
    let mut line = StackText::default();
    let _ = fmt::Write::write_fmt(&mut line, format_args!("vrange: {name}="));
    for &b in value.iter().take(VALUE_MAX) {
        if b == b' ' || b.is_ascii_graphic() {
            line.push(&[b]);
        } else {
            let _ = fmt::Write::write_fmt(&mut line, format_args!("\\x{b:02x}"));
        }
    }
    if value.len() > VALUE_MAX {
        line.push(b"...");
    }
    let _ = fmt::Write::write_fmt(
        &mut line,
        format_args!(" is not valid ({accepted}); using {used}"),
    );
    line.end_line();
    line
}

/// Text of at most `N` bytes formatted without allocating (`write!` into it); what does not fit
/// is cut. For the warnings here and vrange-malloc's exit summary, which must not allocate.
#[derive(Debug)]
pub struct StackText<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> Default for StackText<N> {
    fn default() -> StackText<N> {
        StackText {
            buf: [0; N],
            len: 0,
        }
    }
}

impl<const N: usize> StackText<N> {
    /// Appends what fits of `s`.
    pub fn push(&mut self, s: &[u8]) {
        let n = s.len().min(N - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s[..n]);
        self.len += n;
    }

    /// Ends the text with a newline, over its last byte if it is full.
    pub fn end_line(&mut self) {
        if self.len == N {
            self.len -= 1;
        }
        self.push(b"\n");
    }

    /// The text so far.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl<const N: usize> fmt::Write for StackText<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_every_unit_spelling_in_any_case() {
        for (unit, shift) in [
            ("", 0),
            ("B", 0),
            ("K", 10),
            ("KB", 10),
            ("KiB", 10),
            ("M", 20),
            ("MB", 20),
            ("MiB", 20),
            ("G", 30),
            ("GB", 30),
            ("GiB", 30),
            ("T", 40),
            ("TB", 40),
            ("TiB", 40),
        ] {
            for spelling in [
                unit.to_string(),
                unit.to_ascii_lowercase(),
                unit.to_ascii_uppercase(),
            ] {
                let v = format!("3{spelling}");
                assert_eq!(parse_size(v.as_bytes()), Ok(3 << shift), "{v:?}");
            }
        }
        assert_eq!(parse_size(b"64MiB"), Ok(64 << 20));
        assert_eq!(parse_size(b"mIb"), Err(ParseSizeError::NotANumber));
        assert_eq!(parse_size(b"0"), Ok(0));
        assert_eq!(parse_size(b"0K"), Ok(0));
        assert_eq!(parse_size(b"007"), Ok(7));
    }

    #[test]
    fn sizes_allow_whitespace_around_the_number_and_the_unit() {
        assert_eq!(parse_size(b" 2 GiB "), Ok(2 << 30));
        assert_eq!(parse_size(b"\t64K\n"), Ok(64 << 10));
        assert_eq!(parse_size(b"4096 "), Ok(4096));
        assert_eq!(parse_size(b"64 M"), Ok(64 << 20));
        assert_eq!(parse_size(b"6 4M"), Err(ParseSizeError::BadUnit));
        assert_eq!(parse_size(b"64 M iB"), Err(ParseSizeError::BadUnit));
    }

    #[test]
    fn sizes_refuse_junk() {
        assert_eq!(parse_size(b""), Err(ParseSizeError::Empty));
        assert_eq!(parse_size(b"   "), Err(ParseSizeError::Empty));
        assert_eq!(parse_size(b"M"), Err(ParseSizeError::NotANumber));
        assert_eq!(parse_size(b"-1"), Err(ParseSizeError::NotANumber));
        assert_eq!(parse_size(b"+1"), Err(ParseSizeError::NotANumber));
        assert_eq!(parse_size(b".5G"), Err(ParseSizeError::NotANumber));
        assert_eq!(parse_size(b"12Q"), Err(ParseSizeError::BadUnit));
        assert_eq!(parse_size(b"1.5G"), Err(ParseSizeError::BadUnit));
        assert_eq!(parse_size(b"1e6"), Err(ParseSizeError::BadUnit));
        assert_eq!(parse_size(b"0x10"), Err(ParseSizeError::BadUnit));
        assert_eq!(parse_size(b"1KK"), Err(ParseSizeError::BadUnit));
        assert_eq!(parse_size(b"1Ki"), Err(ParseSizeError::BadUnit));
        assert_eq!(parse_size(b"1Bi"), Err(ParseSizeError::BadUnit));
        assert_eq!(parse_size(b"1P"), Err(ParseSizeError::BadUnit));
        assert_eq!(parse_size(b"1K\0"), Err(ParseSizeError::BadUnit));
        assert_eq!(parse_size("1µ".as_bytes()), Err(ParseSizeError::BadUnit));
    }

    #[test]
    fn sizes_that_overflow_are_errors() {
        assert_eq!(parse_size(b"18446744073709551615"), Ok(u64::MAX));
        assert_eq!(
            parse_size(b"18446744073709551616"),
            Err(ParseSizeError::Overflow)
        );
        assert_eq!(parse_size(b"16777215T"), Ok(16_777_215 << 40));
        assert_eq!(parse_size(b"16777216T"), Err(ParseSizeError::Overflow));
        assert_eq!(parse_size(b"17179869184G"), Err(ParseSizeError::Overflow));
        assert_eq!(
            parse_size(b"99999999999999999999999K"),
            Err(ParseSizeError::Overflow)
        );
    }

    #[test]
    fn numbers_have_no_unit() {
        assert_eq!(parse_number(b" 100 "), Ok(100));
        assert_eq!(parse_number(b"0"), Ok(0));
        assert_eq!(parse_number(b"10K"), Err(ParseSizeError::NotANumber));
        assert_eq!(parse_number(b"10 ms"), Err(ParseSizeError::NotANumber));
        assert_eq!(parse_number(b"-5"), Err(ParseSizeError::NotANumber));
        assert_eq!(parse_number(b""), Err(ParseSizeError::Empty));
    }

    #[test]
    fn switches() {
        for on in ["on", "ON", " yes", "True", "1"] {
            assert_eq!(parse_switch(on.as_bytes()), Some(true), "{on:?}");
        }
        for off in ["off", "Off ", "no", "FALSE", "0"] {
            assert_eq!(parse_switch(off.as_bytes()), Some(false), "{off:?}");
        }
        for junk in ["", "maybe", "2", "o n", "enabled"] {
            assert_eq!(parse_switch(junk.as_bytes()), None, "{junk:?}");
        }
    }

    #[test]
    fn sizes_display_in_the_grammar_they_parse_from() {
        for (n, shown) in [
            (0, "0"),
            (4097, "4097"),
            (16 << 10, "16K"),
            (1536 << 10, "1536K"),
            (64 << 20, "64M"),
            (2 << 30, "2G"),
            (3 << 40, "3T"),
        ] {
            assert_eq!(Size(n).to_string(), shown);
            assert_eq!(parse_size(shown.as_bytes()), Ok(n));
        }
    }

    #[test]
    fn warnings_name_the_variable_the_value_and_what_is_used() {
        let line = warning(
            "VRANGE_MALLOC_MODE",
            b"bogus",
            "hybrid, managed, lazy, off",
            &"hybrid",
        );
        assert_eq!(
            line.bytes(),
            b"vrange: VRANGE_MALLOC_MODE=bogus is not valid (hybrid, managed, lazy, off); using hybrid\n"
        );
        let line = warning("VRANGE_BUDGET", b"1\n2\xff", SIZE_GRAMMAR, &Size(0));
        assert_eq!(
            std::str::from_utf8(line.bytes()).unwrap(),
            format!("vrange: VRANGE_BUDGET=1\\x0a2\\xff is not valid ({SIZE_GRAMMAR}); using 0\n")
        );
    }

    #[test]
    fn warnings_are_one_line_whatever_the_value() {
        let long = [b'x'; 4000];
        let line = warning("VRANGE_STATS_DIR", &long, "a directory", &"/dev/shm");
        let text = std::str::from_utf8(line.bytes()).unwrap();
        assert!(
            text.contains("xxx... is not valid (a directory); using /dev/shm\n"),
            "{text}"
        );
        assert_eq!(text.matches('\n').count(), 1);
        let mut full = StackText::<512>::default();
        full.push(&[b'x'; 600]);
        full.end_line();
        assert_eq!(full.bytes().len(), 512);
        assert_eq!(full.bytes().last(), Some(&b'\n'));
    }

    #[test]
    fn trimming_stops_at_the_first_other_byte() {
        assert_eq!(trim(b" \t a b \n"), b"a b");
        assert_eq!(trim(b"  "), b"");
        assert_eq!(trim(b""), b"");
    }
}
