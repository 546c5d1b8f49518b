//! The hit ratio on a key trace: every cache replays the same requests at the same memory, a
//! miss regenerating the value and inserting it, as a service would.
//!
//! Traces (`--trace FILE`; without one, or with `--trace synthetic`, the synthetic trace below,
//! written to `trace-synthetic.txt`):
//! - ARC's format (Megiddo and Modha's traces): `start count ignored request` per line, a
//!   request for the blocks `start .. start + count`; recognised by four integers on the first
//!   line;
//! - otherwise one key per line: a decimal number is that key (LIRS's traces: one block number
//!   per line), any other line is hashed; empty lines and lines of `*` are skipped.
//!
//! Every value is `--value-size` bytes (default 4 KiB, one block). The memory sizes are
//! fractions of the trace's footprint (distinct keys × value size). At each, vrange-cache has a
//! budget of that many resident bytes (`Options::budget`, so eviction is its own, at slab grain,
//! in the order its purges take; slabs of a sixteenth of the budget, 64 to 256 KiB), and the
//! peers (moka, quick_cache, lru) a byte capacity equal to
//! it, weighed by value length. The target: vrange-cache's hit ratio within one point of the best
//! peer's at every size.
//!
//! The synthetic trace mixes what separates the policies: requests for keys of a Zipf law
//! (exponent 0.8) interleaved with scans of keys that are read once and never again, the
//! pattern under which a plain LRU loses its hot keys.

use super::{Lru, Moka, Store, Vr};
use crate::plot::{self, Axis, Series, Unit};
use crate::report::{self, pct, progress, Csv, Table};
use crate::service::{Rng, Zipf};
use crate::Ctx;
use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write as _;
use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::{Arc, Mutex};
use vrange_cache::{Cache, Options};

/// The memory sizes, in percent of the footprint.
const PERCENTS: [f64; 5] = [1.0, 2.5, 5.0, 10.0, 25.0];
/// The peers, in table order: vrange-cache first.
const PEERS: [&str; 4] = ["vrange-cache", "moka", "quick_cache", "lru"];
/// The target: within this many points of the best peer.
const TARGET_POINTS: f64 = 1.0;

/// A parsed trace: its requests and where it came from.
pub(super) struct Trace {
    pub name: String,
    pub keys: Vec<u64>,
}

impl Trace {
    /// Reads `path` (see the module documentation for the formats).
    pub fn read(path: &Path) -> Result<Trace, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the trace {}: {e}", path.display()))?;
        let keys = parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if keys.is_empty() {
            return Err(format!("{}: the trace has no request", path.display()));
        }
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        Ok(Trace { name, keys })
    }

    /// The synthetic trace: `requests` requests over `keys` Zipf keys, with a scan of
    /// `keys / 10` fresh keys after every `keys / 4` requests.
    pub fn synthetic(requests: usize, keys: usize, seed: u64) -> Trace {
        let zipf = Zipf::new(keys, 0.8);
        let mut rng = Rng::new(seed);
        let (every, scan) = ((keys / 4).max(1), (keys / 10).max(1));
        // Scanned keys come after the Zipf keys and are never repeated.
        let mut fresh = keys as u64;
        let mut out = Vec::with_capacity(requests);
        while out.len() < requests {
            for _ in 0..every.min(requests - out.len()) {
                out.push(zipf.sample(&mut rng) as u64);
            }
            for _ in 0..scan.min(requests - out.len()) {
                out.push(fresh);
                fresh += 1;
            }
        }
        Trace {
            name: format!(
                "synthetic: Zipf 0.8 over {keys} keys, a scan of {scan} after every {every}"
            ),
            keys: out,
        }
    }

    /// Writes one key per line (the trace as replayed, for other tools to replay).
    pub fn write(&self, path: &Path) -> Result<(), String> {
        let file = std::fs::File::create(path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let mut w = std::io::BufWriter::new(file);
        for k in &self.keys {
            writeln!(w, "{k}").map_err(|e| format!("writing {}: {e}", path.display()))?;
        }
        w.flush()
            .map_err(|e| format!("writing {}: {e}", path.display()))
    }

    fn distinct(&self) -> usize {
        self.keys.iter().collect::<HashSet<_>>().len()
    }
}

/// The requests of a trace's text.
fn parse(text: &str) -> Result<Vec<u64>, String> {
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let arc = {
        let f: Vec<&str> = first.split_whitespace().collect();
        f.len() == 4 && f.iter().all(|x| x.parse::<u64>().is_ok())
    };
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.chars().all(|c| c == '*') {
            continue;
        }
        if arc {
            let f: Vec<u64> = line
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|_| format!("line {}: not ARC's `start count ignored request`", n + 1))?;
            let [start, count, ..] = f[..] else {
                return Err(format!("line {}: fewer than four numbers", n + 1));
            };
            let end = start
                .checked_add(count)
                .ok_or_else(|| format!("line {}: start + count overflows", n + 1))?;
            keys.extend(start..end);
        } else if let Ok(k) = line.parse::<u64>() {
            keys.push(k);
        } else {
            let mut h = DefaultHasher::new();
            line.hash(&mut h);
            keys.push(h.finish());
        }
    }
    Ok(keys)
}

/// Replays `trace` through `store`: the hits.
fn replay(store: &impl Store, trace: &Trace, value: usize) -> u64 {
    let mut hits = 0;
    for &k in &trace.keys {
        if store.with(k, |f| matches!(f, super::Found::Hit(_))) {
            hits += 1;
        } else {
            store.regenerate(k, value);
        }
    }
    hits
}

/// The hits of `peer` on `trace` at `memory` bytes.
fn hits(peer: &str, trace: &Trace, memory: usize, value: usize) -> Result<u64, String> {
    let cap = memory as u64;
    Ok(match peer {
        "vrange-cache" => {
            let slab_bytes = slab_for(memory);
            let cache = Cache::try_new(Options {
                budget: Some(memory),
                slab_bytes,
                ..Options::default()
            })
            .map_err(|e| format!("vrange-cache: {e}"))?;
            let vr = Vr(cache);
            let h = replay(&vr, trace, value);
            // Equal memory, checked: the budget is kept on every insert, so the cache ends
            // within the open slab (never purged while values are written into it) of it.
            let held = vr.bytes();
            let slack = (slab_bytes + value + vrange::page_size()) as u64;
            if held > cap + slack {
                return Err(format!(
                    "vrange-cache holds {held} resident bytes over a budget of {cap}"
                ));
            }
            h
        }
        "moka" => replay(
            &Moka::builder()
                .max_capacity(cap)
                .weigher(|_, v: &Arc<[u8]>| u32::try_from(v.len()).unwrap_or(u32::MAX))
                .build(),
            trace,
            value,
        ),
        "quick_cache" => replay(&super::quick(cap, value as u64), trace, value),
        "lru" => {
            let entries = NonZeroUsize::new((memory / value).max(1)).expect("at least one");
            let lru: Lru = Mutex::new(lru::LruCache::new(entries));
            replay(&lru, trace, value)
        }
        other => return Err(format!("unknown peer {other}")),
    })
}

/// vrange-cache's slab size at a budget of `memory`: the default 256 KiB, smaller for small
/// budgets (a sixteenth of it, at least the 64 KiB minimum), as a user sizing a small cache
/// would choose.
fn slab_for(memory: usize) -> usize {
    (memory / 16).clamp(64 << 10, Options::default().slab_bytes)
}

/// The replay part of the cache suite: `--trace FILE`, or the synthetic trace (no `--trace`,
/// or `--trace synthetic`).
pub(super) fn hit_ratio(ctx: &Ctx) -> Result<(), String> {
    let value = ctx.args.value_size.unwrap_or(4096);
    let trace = match &ctx.args.trace {
        Some(path) if path.as_os_str() != "synthetic" => Trace::read(path)?,
        _ => {
            let (requests, keys) = if ctx.quick() {
                (100_000, 10_000)
            } else {
                (2_000_000, 100_000)
            };
            let t = Trace::synthetic(requests, keys, 1);
            t.write(&ctx.out.join("trace-synthetic.txt"))?;
            t
        }
    };
    let distinct = trace.distinct();
    let footprint = distinct
        .checked_mul(value)
        .ok_or("the trace's footprint overflows")?;
    ctx.say(format!(
        "cache, hit ratio on a trace: {} ({} requests, {} distinct keys, values of {}, \
         footprint {}). Every cache replays the same requests; a miss regenerates the value and \
         inserts it. Memory: vrange-cache's budget of resident bytes, the peers' capacity in \
         value bytes. Target: vrange-cache within {TARGET_POINTS} point of the best peer at \
         every size.",
        trace.name,
        trace.keys.len(),
        distinct,
        report::size(value),
        report::size(footprint),
    ));
    let mut headers = vec!["memory"];
    headers.extend(PEERS);
    headers.extend(["vrange-cache − best peer", "target"]);
    let mut table = Table::new(&headers);
    let mut csv = Csv::new(&["memory_bytes", "peer", "requests", "hits", "hit_ratio"]);
    let mut series: Vec<Series> = PEERS.iter().map(|p| Series::new(*p, vec![])).collect();
    for percent in PERCENTS {
        let memory = ((footprint as f64 * percent / 100.0) as usize).max(value);
        let mut ratios = Vec::new();
        for (i, peer) in PEERS.iter().enumerate() {
            progress(format!("cache trace: {peer} at {}", report::size(memory)));
            let h = hits(peer, &trace, memory, value)?;
            let ratio = h as f64 / trace.keys.len() as f64;
            csv.row([
                memory.to_string(),
                (*peer).to_string(),
                trace.keys.len().to_string(),
                h.to_string(),
                format!("{ratio:.4}"),
            ]);
            series[i].points.push((memory as f64, ratio * 100.0));
            ratios.push(ratio);
        }
        let best = ratios[1..].iter().copied().fold(0.0, f64::max);
        let behind = (ratios[0] - best) * 100.0;
        let mut row = vec![format!("{} ({percent}%)", report::size(memory))];
        row.extend(ratios.iter().map(|&r| pct(r)));
        row.push(format!("{behind:+.1} points"));
        row.push(
            if behind >= -TARGET_POINTS {
                "met"
            } else {
                "missed"
            }
            .to_string(),
        );
        table.row(row);
    }
    ctx.table(&table);
    csv.write(&ctx.out, "cache-trace.csv")?;
    let svg = plot::lines(
        // The name up to its details (the synthetic trace's are in the report).
        &ctx.figure(format!(
            "hit ratio by memory, trace {}",
            trace.name.split(':').next().unwrap_or_default()
        )),
        &Axis::log("memory (bytes)", Unit::Bytes),
        &Axis::linear("hit ratio (%)", Unit::Plain),
        &series,
    );
    report::write_file(&ctx.out, "cache-trace.svg", &svg)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arc_lines_expand_to_their_blocks_and_other_lines_are_keys() {
        assert_eq!(parse("10 3 0 1\n7 1 0 2\n").unwrap(), [10, 11, 12, 7]);
        assert!(parse("10 3 0 1\nx\n").is_err());
        assert!(parse("1 18446744073709551615 0 1\n").is_err());
        let lirs = parse("5\n*\n\n5\n9\n").unwrap();
        assert_eq!(lirs, [5, 5, 9]);
        let words = parse("GET /a\nGET /b\nGET /a\n").unwrap();
        assert_eq!(words.len(), 3);
        assert_eq!(words[0], words[2]);
        assert_ne!(words[0], words[1]);
    }

    #[test]
    fn the_synthetic_trace_scans_fresh_keys() {
        let t = Trace::synthetic(1000, 100, 1);
        assert_eq!(t.keys.len(), 1000);
        // 25 Zipf requests (keys below 100), then 10 fresh keys: 28 whole rounds in 980
        // requests, then 20 Zipf requests.
        let fresh: Vec<u64> = t.keys.iter().copied().filter(|&k| k >= 100).collect();
        assert_eq!(fresh.len(), 280);
        assert_eq!(
            fresh.iter().collect::<HashSet<_>>().len(),
            280,
            "a scanned key repeats"
        );
        assert!(t.keys[..25].iter().all(|&k| k < 100));
    }

    #[test]
    fn an_lru_of_the_whole_footprint_misses_each_key_once() {
        let t = Trace {
            name: "t".into(),
            keys: vec![1, 2, 3, 1, 2, 3, 1],
        };
        assert_eq!(hits("lru", &t, 3 * 64, 64).unwrap(), 4);
        assert_eq!(hits("lru", &t, 2 * 64, 64).unwrap(), 0);
    }
}
