//! What the cache's tests share: values that check themselves, and a quiet reclaimer.

#![allow(dead_code)] // each test uses part of it

/// A value for `key`'s `version`, `len` bytes: a 16-byte header (key, version) when it fits,
/// then bytes that depend on both, so a torn or misplaced value is caught by [`check`].
pub fn value(key: u64, version: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    write(&mut v, key, version);
    v
}

/// Writes [`value`] in place.
pub fn write(buf: &mut [u8], key: u64, version: u64) {
    let mut h =
        key.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    for (i, b) in buf.iter_mut().enumerate() {
        h = h.rotate_left(7) ^ i as u64;
        *b = (h as u8) | 1;
    }
    if buf.len() >= 16 {
        buf[..8].copy_from_slice(&key.to_le_bytes());
        buf[8..16].copy_from_slice(&version.to_le_bytes());
    }
}

/// Whether `v` is exactly [`value`]`(key, version, v.len())`.
pub fn check(v: &[u8], key: u64, version: u64) -> bool {
    *v == value(key, version, v.len())[..]
}

/// The version a self-describing value (at least 16 bytes) says it is, if it is `key`'s and
/// its bytes are all right.
pub fn version_of(v: &[u8], key: u64) -> Option<u64> {
    if v.len() < 16 || v[..8] != key.to_le_bytes() {
        return None;
    }
    let version = u64::from_le_bytes(v[8..16].try_into().unwrap());
    check(v, key, version).then_some(version)
}

/// Turns off every pressure source of this process's reclaimer, so that only the test's own
/// `vrange::purge` calls purge anything, and purges what volatile memory the process has now:
/// the regions earlier tests' caches left in the pool (the lowest class) would otherwise go
/// before the test's own.
pub fn quiet_reclaimer() {
    for (k, v) in [
        ("VRANGE_PSI", "off"),
        ("VRANGE_VMPRESSURE", "0"),
        ("VRANGE_HEADROOM", "0"),
        ("VRANGE_BUDGET", "0"),
        ("VRANGE_ARM_DELAY_MS", "3600000"),
    ] {
        vrange::set_option(k, v).expect(k);
    }
    vrange::purge(usize::MAX);
}
