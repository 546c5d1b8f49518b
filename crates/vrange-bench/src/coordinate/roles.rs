//! The processes of the coordinate suite: participants serving from volatile (or plain)
//! chunks, and the neighbour.

use super::*;
// ---------------------------------------------------------------------------------------
// The chunks' content: a cheap pattern per chunk, checked one word per page.

pub(super) fn word(key: u64, i: usize) -> u64 {
    key.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i as u64).wrapping_add(1)
}

pub(super) fn fill(key: u64, buf: &mut [u8]) {
    for (i, w) in buf.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&word(key, i).to_le_bytes());
    }
}

/// Whether `buf` holds chunk `key`'s content (the first word of every page; a purged page
/// reads as zero, which no word of the pattern is).
pub(super) fn check(key: u64, buf: &[u8]) -> bool {
    let page = vrange::page_size();
    buf.len() == CHUNK
        && (0..CHUNK / page).all(|p| {
            let i = p * page / 8;
            buf[i * 8..i * 8 + 8] == word(key, i).to_le_bytes()
        })
}

/// splitmix64.
pub(super) fn next(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Chunk `k` of `n` drawn with probability ∝ 1/(k+1)^s.
pub(super) struct Zipf {
    pub(super) cdf: Vec<f64>,
}

impl Zipf {
    pub(super) fn new(n: usize, s: f64) -> Zipf {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (0..n)
            .map(|k| {
                acc += 1.0 / ((k + 1) as f64).powf(s);
                acc
            })
            .collect();
        cdf.iter_mut().for_each(|c| *c /= acc);
        Zipf { cdf }
    }

    pub(super) fn sample(&self, x: &mut u64) -> usize {
        let u = (next(x) >> 11) as f64 / (1u64 << 53) as f64;
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

// ---------------------------------------------------------------------------------------
// The participant.

/// One chunk of a participant's cache.
#[derive(Default)]
pub(super) struct Slot {
    pub(super) volatile: Option<VolatileRegion>,
    pub(super) plain: Option<Vec<u8>>,
    /// When it was last made volatile, and when a scan last found it intact (ns).
    pub(super) marked_at: u64,
    pub(super) intact_at: u64,
    /// Its purge was reported already.
    pub(super) reported: bool,
}

impl Slot {
    /// Reports the chunk's purge once: how long it had been volatile when last seen intact.
    pub(super) fn report_purge(&mut self, k: usize) -> bool {
        if self.reported {
            return false;
        }
        self.reported = true;
        let age_ms = self.intact_at.saturating_sub(self.marked_at) / 1_000_000;
        println!("purge chunk={k} age_ms={age_ms}");
        true
    }
}

pub(super) enum Outcome {
    Hit,
    Miss,
    Wrong,
}

/// One second of a participant.
#[derive(Default, Clone, Copy, Debug)]
pub(super) struct Second {
    pub(super) req: u64,
    pub(super) hit: u64,
    pub(super) miss: u64,
    pub(super) wrong: u64,
    pub(super) purged: u64,
}

impl Second {
    pub(super) fn add(&mut self, o: &Second) {
        self.req += o.req;
        self.hit += o.hit;
        self.miss += o.miss;
        self.wrong += o.wrong;
        self.purged += o.purged;
    }

    pub(super) fn rate(&self) -> f64 {
        if self.req == 0 {
            0.0
        } else {
            self.hit as f64 / self.req as f64
        }
    }
}

pub(super) struct Participant {
    pub(super) index: u64,
    pub(super) slots: Vec<Slot>,
    pub(super) volatile: bool,
}

impl Participant {
    pub(super) fn key(&self, k: usize) -> u64 {
        (self.index << 16) | k as u64
    }

    /// Serves one request for chunk `k`.
    pub(super) fn request(&mut self, k: usize) -> Result<Outcome, String> {
        let key = self.key(k);
        let slot = &mut self.slots[k];
        if !self.volatile {
            return Ok(match &slot.plain {
                Some(buf) if check(key, buf) => Outcome::Hit,
                Some(_) => Outcome::Wrong,
                None => {
                    let mut buf = vec![0u8; CHUNK];
                    fill(key, &mut buf);
                    slot.plain = Some(buf);
                    Outcome::Miss
                }
            });
        }
        let fresh = slot.volatile.is_none();
        if fresh {
            let opts = vrange::Options {
                policy: Policy::Managed,
                ..vrange::Options::default()
            };
            slot.volatile =
                Some(VolatileRegion::new(CHUNK, opts).map_err(|e| format!("region: {e}"))?);
        }
        let Some(region) = slot.volatile.as_mut() else {
            unreachable!("made above");
        };
        let mut pinned = region.pin().map_err(|e| format!("pin: {e}"))?;
        let purged = pinned.was_purged();
        let outcome = if fresh || purged {
            fill(key, &mut pinned);
            Outcome::Miss
        } else if check(key, &pinned) {
            Outcome::Hit
        } else {
            Outcome::Wrong
        };
        // Unpinned: volatile again from now.
        drop(pinned);
        if purged {
            slot.report_purge(k);
        }
        slot.marked_at = now_ns();
        slot.intact_at = slot.marked_at;
        slot.reported = false;
        Ok(outcome)
    }

    /// Finds the chunks purged since the last scan; returns how many.
    pub(super) fn scan(&mut self, now: u64) -> u64 {
        let mut found = 0;
        for (k, slot) in self.slots.iter_mut().enumerate() {
            let Some(r) = &slot.volatile else { continue };
            if r.is_purged() {
                found += u64::from(slot.report_purge(k));
            } else {
                slot.intact_at = now;
            }
        }
        found
    }
}

/// Reaction times of the process's own reclaimer since the last call: one line per source
/// that purged (the mean over its new events, and how many).
pub(super) fn print_reactions(last: &mut [(u64, u64); 7]) {
    let st = vrange::stats();
    for (i, (s, src)) in st.sources.iter().zip(Source::ALL).enumerate() {
        let (events, total) = last[i];
        let n = s.purging_events.saturating_sub(events);
        if let Some(mean) = s.reaction_total_ns.saturating_sub(total).checked_div(n) {
            println!("reaction source={} ns={mean} n={n}", src.name());
        }
        last[i] = (s.purging_events, s.reaction_total_ns);
    }
}

pub(super) fn sleep_until(t: u64) {
    let now = now_ns();
    if now < t {
        std::thread::sleep(Duration::from_nanos(t - now));
    }
}

/// `coordinate-participant INDEX CHUNKS RATE EPOCH_NS FILL_NS END_NS MODE PREFILL`.
pub fn participant_role(args: &[String]) -> i32 {
    let usage = "usage: vrange-bench role coordinate-participant INDEX CHUNKS RATE EPOCH_NS \
                 FILL_NS END_NS volatile|plain PREFILL";
    let [index, chunks, rate, epoch, fill_at, end, mode, prefill] = args else {
        eprintln!("{usage}");
        return 2;
    };
    let nums: Vec<u64> = [index, chunks, rate, epoch, fill_at, end, prefill]
        .iter()
        .filter_map(|a| a.parse().ok())
        .collect();
    let &[index, chunks, rate, epoch, fill_at, end, prefill] = nums.as_slice() else {
        eprintln!("{usage}");
        return 2;
    };
    let volatile = match mode.as_str() {
        "volatile" => true,
        "plain" => false,
        _ => {
            eprintln!("{usage}");
            return 2;
        }
    };
    // The OOM killer's first choice, so that the neighbour is spared (lowering the
    // neighbour's score instead would need CAP_SYS_RESOURCE).
    let _ = vrange_testkit::hog::prefer_oom_kill();
    let mut p = Participant {
        index,
        slots: (0..chunks).map(|_| Slot::default()).collect(),
        volatile,
    };
    sleep_until(fill_at);
    if prefill == 1 {
        for k in 0..p.slots.len() {
            if let Err(e) = p.request(k) {
                eprintln!("participant {index}: {e}");
                return 1;
            }
        }
    }
    println!("serving");
    let zipf = Zipf::new(p.slots.len().max(1), ZIPF);
    let mut x = now_ns() ^ (index << 32);
    let period = SEC / rate.max(1);
    let scan = SCAN.as_nanos() as u64;
    let mut reactions = [(0u64, 0u64); 7];
    let start = now_ns();
    let (mut next_req, mut next_scan, mut next_stats) = (start, start, start);
    let mut sec = start.saturating_sub(epoch) / SEC;
    let mut c = Second::default();
    loop {
        let now = now_ns();
        if volatile && now >= next_scan {
            c.purged += p.scan(now);
            next_scan = now + scan;
        }
        if volatile && now >= next_stats {
            print_reactions(&mut reactions);
            next_stats = now + SEC / 10;
        }
        if now >= next_req && now < end {
            let k = zipf.sample(&mut x);
            match p.request(k) {
                Ok(Outcome::Hit) => c.hit += 1,
                Ok(Outcome::Miss) => c.miss += 1,
                Ok(Outcome::Wrong) => c.wrong += 1,
                Err(e) => {
                    eprintln!("participant {index}: {e}");
                    return 1;
                }
            }
            c.req += 1;
            next_req += period;
            // Behind by more than a second (a stall): no backlog.
            if next_req + SEC < now {
                next_req = now;
            }
        }
        let n = now.saturating_sub(epoch) / SEC;
        if n != sec || now >= end {
            println!(
                "sec n={sec} req={} hit={} miss={} wrong={} purged={}",
                c.req, c.hit, c.miss, c.wrong, c.purged
            );
            (sec, c) = (n, Second::default());
        }
        if now >= end {
            break;
        }
        let wake = next_req.min(if volatile { next_scan } else { u64::MAX });
        let nap = wake.saturating_sub(now_ns()).min(scan);
        if nap > 0 {
            std::thread::sleep(Duration::from_nanos(nap));
        }
    }
    if volatile {
        print_reactions(&mut reactions);
    }
    let st = vrange::stats().coordinator;
    println!(
        "end connections={} requests={} deferred={} bytes={}",
        st.connections, st.requests, st.deferred, st.bytes
    );
    0
}

// ---------------------------------------------------------------------------------------
// The neighbour.

/// The neighbour's resident bytes at `t_ms` after the epoch: none during the warm-up, then a
/// raised cosine 0 → `peak` → 0 over `period_ms`, then none.
pub(super) fn neighbour_target(peak: u64, warmup_ms: u64, period_ms: u64, t_ms: u64) -> u64 {
    if t_ms < warmup_ms || t_ms >= warmup_ms + period_ms {
        return 0;
    }
    let x = (t_ms - warmup_ms) as f64 / period_ms as f64;
    (peak as f64 * (1.0 - (2.0 * std::f64::consts::PI * x).cos()) / 2.0) as u64
}

/// `coordinate-neighbour PEAK EPOCH_NS WARMUP_MS PERIOD_MS END_NS`: resident memory following
/// [`neighbour_target`] (pages written as it grows, dropped as it shrinks) until `END_NS`.
pub fn neighbour_role(args: &[String]) -> i32 {
    let nums: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let &[peak, epoch, warmup_ms, period_ms, end] = nums.as_slice() else {
        eprintln!(
            "usage: vrange-bench role coordinate-neighbour PEAK EPOCH_NS WARMUP_MS PERIOD_MS END_NS"
        );
        return 2;
    };
    let page = vrange::page_size();
    let bytes = (peak as usize).next_multiple_of(page).max(page);
    let Ok(p) = vrange_sys::mem::map_anon(bytes, page) else {
        eprintln!("coordinate neighbour: cannot map {bytes} bytes");
        return 1;
    };
    println!("ready");
    let mut held = 0usize;
    loop {
        let now = now_ns();
        if now >= end {
            break;
        }
        let t_ms = now.saturating_sub(epoch) / 1_000_000;
        let target =
            (neighbour_target(peak, warmup_ms, period_ms, t_ms) as usize).min(bytes) / page * page;
        if target > held {
            for off in (held..target).step_by(page) {
                // SAFETY: inside the neighbour's own mapping.
                unsafe { p.as_ptr().add(off).write_volatile(1) };
            }
        } else if target < held {
            // SAFETY: the neighbour's own pages; nothing refers to their content.
            let _ = unsafe { vrange_sys::mem::purge_forced(p.as_ptr().add(target), held - target) };
        }
        held = target;
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("done");
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_check_and_differ_by_key() {
        let mut buf = vec![0u8; CHUNK];
        assert!(!check(1, &buf), "zeros are not a chunk");
        fill(1, &mut buf);
        assert!(check(1, &buf));
        assert!(!check(2, &buf));
        buf[vrange::page_size() * 3] = 0;
        assert!(!check(1, &buf));
    }

    #[test]
    fn the_neighbour_ramps_up_and_down() {
        assert_eq!(neighbour_target(100, 1000, 10_000, 500), 0);
        assert_eq!(neighbour_target(100, 1000, 10_000, 6000), 100);
        assert_eq!(neighbour_target(100, 1000, 10_000, 11_000), 0);
    }

    #[test]
    fn zipf_favours_the_first_chunks() {
        let z = Zipf::new(8, ZIPF);
        let mut x = 7;
        let mut counts = [0u32; 8];
        for _ in 0..10_000 {
            counts[z.sample(&mut x)] += 1;
        }
        assert!(counts[0] > 5 * counts[7], "{counts:?}");
        assert!(counts.iter().all(|&c| c > 0), "{counts:?}");
    }
}
