//! `vrange_version`: the library's version as one number, to compare with the header's
//! `VRANGE_VERSION` (`tests/c/test_version.c` checks both against this crate's version).

const MAJOR: u32 = number(env!("CARGO_PKG_VERSION_MAJOR"));
const MINOR: u32 = number(env!("CARGO_PKG_VERSION_MINOR"));
const PATCH: u32 = number(env!("CARGO_PKG_VERSION_PATCH"));

// VRANGE_VERSION gives minor and patch two decimal digits each, as ZSTD_VERSION_NUMBER does.
const _: () = assert!(MINOR < 100 && PATCH < 100);

/// A version component (decimal digits, as cargo guarantees), at compile time.
const fn number(digits: &str) -> u32 {
    let bytes = digits.as_bytes();
    let mut n = 0;
    let mut i = 0;
    while i < bytes.len() {
        n = n * 10 + (bytes[i] - b'0') as u32;
        i += 1;
    }
    n
}

/// The running library's version, `major * 10000 + minor * 100 + patch`: `VRANGE_VERSION` of
/// the header it was built with.
#[no_mangle]
pub extern "C" fn vrange_version() -> libc::c_uint {
    MAJOR * 10000 + MINOR * 100 + PATCH
}
