//! Validation of caller-supplied ranges, shared by every entry point.

/// Highest user address tracked, exclusive (48-bit virtual addresses).
pub(crate) const ADDR_LIMIT: usize = 1 << 48;
use crate::Error;
use vrange_sys::mem::page_size;

/// The length of a new region: `len` rounded up to a page. [`Error::NotRegion`] for zero,
/// [`Error::Overflow`] past `isize::MAX`.
pub(crate) fn region_len(len: usize) -> Result<usize, Error> {
    let page = page_size();
    if len == 0 {
        return Err(Error::NotRegion);
    }
    let len = len.checked_add(page - 1).ok_or(Error::Overflow)? & !(page - 1);
    if len > isize::MAX as usize {
        return Err(Error::Overflow);
    }
    Ok(len)
}

/// A page-aligned, non-overflowing address range `[start, end)` within the tracked space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    /// Checks `start`/`len` the way madvise(2) does: `start` page-aligned, `len` rounded up to
    /// a page, no overflow. Async-signal-safe.
    pub fn new(start: usize, len: usize) -> Result<Span, Error> {
        let page = page_size();
        if start & (page - 1) != 0 {
            return Err(Error::Unaligned);
        }
        let rounded = len.checked_add(page - 1).ok_or(Error::Overflow)? & !(page - 1);
        if rounded > isize::MAX as usize {
            return Err(Error::Overflow);
        }
        let end = start.checked_add(rounded).ok_or(Error::Overflow)?;
        if end > ADDR_LIMIT {
            return Err(Error::OutOfReach);
        }
        Ok(Span { start, end })
    }

    pub fn len(&self) -> usize {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_and_rejects_like_madvise() {
        let p = page_size();
        assert_eq!(Span::new(p, 1).unwrap().len(), p);
        assert_eq!(Span::new(p, 0).unwrap().len(), 0);
        assert_eq!(Span::new(p + 1, p), Err(Error::Unaligned));
        assert_eq!(Span::new(usize::MAX & !(p - 1), p), Err(Error::Overflow));
        assert_eq!(Span::new(p, usize::MAX - p), Err(Error::Overflow));
        assert_eq!(Span::new(ADDR_LIMIT, p), Err(Error::OutOfReach));
    }
}
