//! A tile server that caches what it renders and keeps serving while its memory shrinks.
//!
//! Rendering a 128×128 tile of the Mandelbrot set (the stand-in for decoding an image or
//! rendering a page) costs about a millisecond; serving a cached one costs a lookup. The
//! program answers requests for 4,096 tiles (256 MiB if all were cached), the popular ones
//! more often, from a `vrange_cache::Cache` with no capacity, and prints each second its hit
//! rate, what the cache holds, and what the system took back, next to the limit in force and
//! the cgroup's usage as the kernel reports them (a limit the kernel refused is reported, not
//! printed as if it held).
//!
//! Run as root (or with a writable memory cgroup), it moves itself into a child memory cgroup
//! and shrinks its limit every few seconds, 256 → 192 → 128 → 96 → 64 MiB: the cache gives the
//! memory back, least recently used tiles first, and the server keeps serving, never
//! OOM-killed. Elsewhere it runs without a limit and says so.
//!
//! ```sh
//! cargo run --release -p vrange-cache --example tiles -- 20   # seconds (default 20)
//! ```

use std::time::{Duration, Instant};
use vrange::Priority;
use vrange_cache::{Cache, Miss, Options};
use vrange_sys::cgroup::{unique_name, ChildCgroup, MemCgroup};

const TILE: usize = 128;
const TILES: u64 = 4096;
const MIB: u64 = 1 << 20;
const LIMITS: [u64; 5] = [256 * MIB, 192 * MIB, 128 * MIB, 96 * MIB, 64 * MIB];

/// Renders tile `n` (64 columns by 64 rows of tiles over the set) as 8-bit RGBA.
fn render(n: u64, out: &mut [u8]) {
    let (tx, ty) = ((n % 64) as f64, (n / 64) as f64);
    for y in 0..TILE {
        for x in 0..TILE {
            let cr = -2.0 + 2.6 * (tx + x as f64 / TILE as f64) / 64.0;
            let ci = -1.3 + 2.6 * (ty + y as f64 / TILE as f64) / 64.0;
            let (mut zr, mut zi, mut i) = (0.0f64, 0.0f64, 0u32);
            while i < 200 && zr * zr + zi * zi < 4.0 {
                (zr, zi) = (zr * zr - zi * zi + cr, 2.0 * zr * zi + ci);
                i += 1;
            }
            let p = &mut out[(y * TILE + x) * 4..][..4];
            p.copy_from_slice(&[(i * 7) as u8, (i * 3) as u8, i as u8, 255]);
        }
    }
}

/// A child cgroup of this process's memory cgroup with this process in it, or why not.
fn confine() -> Result<ChildCgroup, String> {
    let parent = MemCgroup::current().ok_or("no memory cgroup")?;
    let child = parent
        .create_child(&unique_name("vrange-tiles-"), LIMITS[0])
        .map_err(|e| format!("cannot create a child memory cgroup: {e}"))?;
    child
        .add_pid(std::process::id() as i32)
        .map_err(|e| format!("cannot join it: {e}"))?;
    Ok(child)
}

fn main() {
    let seconds: u64 = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("seconds: a number"))
        .unwrap_or(20);
    let cgroup = match confine() {
        Ok(c) => Some(c),
        Err(why) => {
            println!("running without a memory limit ({why})");
            None
        }
    };
    let cache: Cache<u64> = Cache::new(Options::default());
    let start = Instant::now();
    let mut dice = 0x2545_f491_4f6c_dd1du64;
    let (mut hits, mut renders, mut purged, mut requests) = (0u64, 0u64, 0u64, 0u64);
    let mut next_report = Duration::from_secs(1);
    let mut checksum = 0u64;
    // The limit the cgroup was made with; changes are asked for as the steps come.
    let mut asked = LIMITS[0];
    // "resident": at most this much of the cache is in memory (pages written, not known to
    // be purged); "cgroup": what the whole cgroup uses, as the kernel counts it.
    println!(" time  limit    requests  hit rate  renders  purged  cached   resident  cgroup");
    while start.elapsed() < Duration::from_secs(seconds) {
        // Popular tiles first: the square of a uniform number favours small tile numbers.
        dice ^= dice << 13;
        dice ^= dice >> 7;
        dice ^= dice << 17;
        let u = (dice >> 11) as f64 / (1u64 << 53) as f64;
        let tile = (u * u * TILES as f64) as u64;
        requests += 1;
        let was = cache.lookup(&tile);
        match &was {
            Ok(_) => hits += 1,
            Err(Miss::Purged) => purged += 1,
            Err(Miss::Absent) => {}
        }
        let entry = match was {
            Ok(e) => e,
            Err(_) => {
                renders += 1;
                cache
                    .get_or_insert_with(tile, TILE * TILE * 4, Priority::Normal, |b| {
                        render(tile, b)
                    })
                    .expect("memory for a tile")
            }
        };
        checksum = checksum.wrapping_add(u64::from(entry[(tile as usize * 4) % entry.len()]));
        drop(entry);
        if start.elapsed() >= next_report {
            let t = next_report.as_secs();
            // The limit printed is the one read back from the cgroup: a refused change is
            // reported, not assumed.
            let limit = cgroup.as_ref().and_then(|c| {
                let step = (t as usize * LIMITS.len() / seconds.max(1) as usize).min(4);
                let want = LIMITS[step];
                if want != asked {
                    asked = want;
                    if let Err(e) = c.set_limit(want) {
                        eprintln!("cannot set the cgroup's limit to {} MiB: {e}", want / MIB);
                    }
                }
                c.cgroup().limit()
            });
            let s = cache.stats();
            let usage = cgroup.as_ref().and_then(|c| c.cgroup().usage().ok());
            println!(
                "{t:>4}s  {:>5}  {requests:>10}  {:>7.1} %  {renders:>7}  {purged:>6}  {:>6}  {:>5} MiB  {:>6}",
                limit.map_or("none".into(), |l| format!("{}M", l / MIB)),
                100.0 * hits as f64 / requests.max(1) as f64,
                s.entries,
                s.resident_bytes() / MIB,
                usage.map_or("-".into(), |u| format!("{}M", u / MIB)),
            );
            (hits, renders, purged, requests) = (0, 0, 0, 0);
            next_report += Duration::from_secs(1);
        }
    }
    let kills = cgroup
        .as_ref()
        .and_then(|c| c.cgroup().oom_kills().ok())
        .unwrap_or(0);
    println!("done: OOM kills in the cgroup: {kills} (checksum {checksum:x})");
}
