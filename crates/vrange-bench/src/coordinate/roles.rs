//! The participant of the coordinate suite: a cache of volatile (or plain) chunks serving
//! requests, and in the shared configurations its partner, a second process mapping its
//! shared region. (Its neighbour is the cache suite's too: `neighbour.rs`.)

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

// ---------------------------------------------------------------------------------------
// The participant.

/// One chunk of a participant's cache.
#[derive(Default)]
pub(super) struct Slot {
    pub(super) volatile: Option<VolatileRegion>,
    pub(super) plain: Option<Vec<u8>>,
    /// Shared mode: whether the chunk's range of the shared region was filled once.
    pub(super) filled: bool,
    /// When it was last made volatile, and when a scan last found it intact (ns).
    pub(super) marked_at: u64,
    pub(super) intact_at: u64,
    /// Its purge was reported already.
    pub(super) reported: bool,
}

impl Slot {
    /// The chunk was unpinned after a request (which found it `purged` or not): volatile
    /// again from now.
    pub(super) fn unpinned(&mut self, k: usize, purged: bool) {
        if purged {
            self.report_purge(k);
        }
        self.marked_at = now_ns();
        self.intact_at = self.marked_at;
        self.reported = false;
    }

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

pub(super) struct Participant {
    pub(super) index: u64,
    pub(super) slots: Vec<Slot>,
    pub(super) volatile: bool,
    /// Shared mode: one shared region holding every chunk, chunk k its k-th range of
    /// [`CHUNK`] bytes, pinned and unpinned on its own.
    pub(super) shared: Option<VolatileRegion>,
}

impl Participant {
    pub(super) fn key(&self, k: usize) -> u64 {
        (self.index << 16) | k as u64
    }

    /// Serves one request for chunk `k`.
    pub(super) fn request(&mut self, k: usize) -> Result<Outcome, String> {
        let key = self.key(k);
        let slot = &mut self.slots[k];
        if let Some(region) = &self.shared {
            return shared_request(region, slot, k, key);
        }
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
        let outcome = serve(key, &mut pinned, fresh || purged);
        // Unpinned: volatile again from now.
        drop(pinned);
        slot.unpinned(k, purged);
        Ok(outcome)
    }

    /// Finds the chunks purged since the last scan; returns how many.
    pub(super) fn scan(&mut self, now: u64) -> u64 {
        let mut found = 0;
        for (k, slot) in self.slots.iter_mut().enumerate() {
            let purged = match (&self.shared, &slot.volatile) {
                (Some(r), _) if slot.filled => r.is_purged_range(k * CHUNK, CHUNK) == Ok(true),
                (None, Some(r)) => r.is_purged(),
                _ => continue,
            };
            if purged {
                found += u64::from(slot.report_purge(k));
            } else {
                slot.intact_at = now;
            }
        }
        found
    }
}

/// Serves a request for chunk `k` (`key`) of the shared region `region`: pins its range, checks
/// or refills it, unpins it.
fn shared_request(
    region: &VolatileRegion,
    slot: &mut Slot,
    k: usize,
    key: u64,
) -> Result<Outcome, String> {
    let off = k * CHUNK;
    let u = region
        .unmark_range(off, CHUNK)
        .map_err(|e| format!("pin: {e}"))?;
    // SAFETY: the range lies in the region, is pinned by this mapping until the mark below,
    // and only this thread of this process writes it.
    let buf = unsafe { std::slice::from_raw_parts_mut(region.as_ptr().add(off), CHUNK) };
    let purged = u.was_purged();
    let outcome = serve(key, buf, !slot.filled || purged);
    slot.filled = true;
    // SAFETY: `buf` is not used from here on: the range may be purged once unpinned.
    unsafe { region.mark_range(off, CHUNK) }.map_err(|e| format!("unpin: {e}"))?;
    slot.unpinned(k, purged);
    Ok(outcome)
}

/// One request's work on pinned chunk `key`: fills it when it must be (`refill`: new, or
/// purged: a miss), else checks it (a hit, or a wrong value).
fn serve(key: u64, buf: &mut [u8], refill: bool) -> Outcome {
    if refill {
        fill(key, buf);
        Outcome::Miss
    } else if check(key, buf) {
        Outcome::Hit
    } else {
        Outcome::Wrong
    }
}

/// The shared region of a participant in shared mode, and its partner: a second process that
/// maps it (as a browser maps its renderers' discardable memory) until `end`.
fn shared_region(chunks: usize, end: u64) -> Result<(VolatileRegion, std::process::Child), String> {
    use std::os::fd::AsRawFd;
    let opts = vrange::Options {
        shared: true,
        ..vrange::Options::default()
    };
    let region = VolatileRegion::new(chunks * CHUNK, opts).map_err(|e| format!("region: {e}"))?;
    let fd = region.shared_fd().ok_or("no descriptor")?.as_raw_fd();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["role", "coordinate-partner", &end.to_string()])
        .env(PARTNER_FD, fd.to_string());
    vrange_testkit::proc::inherit_fd(&mut cmd, fd);
    let partner = cmd.spawn().map_err(|e| format!("partner: {e}"))?;
    Ok((region, partner))
}

/// The variable that gives the partner its descriptor's number.
const PARTNER_FD: &str = "VRANGE_BENCH_SHARED_FD";

/// `coordinate-partner END_NS`: maps the shared region whose descriptor it inherited (number in
/// `VRANGE_BENCH_SHARED_FD`), pins nothing, and keeps it mapped until `END_NS`.
pub fn partner_role(args: &[String]) -> i32 {
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    let usage = "usage: vrange-bench role coordinate-partner END_NS (descriptor in \
                 VRANGE_BENCH_SHARED_FD)";
    let (Some(end), Some(fd)) = (
        args.first().and_then(|a| a.parse::<u64>().ok()),
        std::env::var(PARTNER_FD)
            .ok()
            .and_then(|v| v.parse::<i32>().ok()),
    ) else {
        eprintln!("{usage}");
        return 2;
    };
    // SAFETY: the participant kept this descriptor open across exec for this process; nothing
    // else here owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let region = match VolatileRegion::open_shared(fd.as_fd(), vrange::Priority::Normal) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("partner: {e}");
            return 1;
        }
    };
    drop(fd);
    sleep_until(end);
    drop(region);
    0
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

/// `coordinate-participant INDEX CHUNKS RATE EPOCH_NS FILL_NS END_NS MODE PREFILL`.
pub fn participant_role(args: &[String]) -> i32 {
    let usage = "usage: vrange-bench role coordinate-participant INDEX CHUNKS RATE EPOCH_NS \
                 FILL_NS END_NS volatile|shared|plain PREFILL";
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
    let (volatile, shared) = match mode.as_str() {
        "volatile" => (true, false),
        "shared" => (true, true),
        "plain" => (false, false),
        _ => {
            eprintln!("{usage}");
            return 2;
        }
    };
    // The OOM killer's first choice, so that the neighbour is spared (lowering the
    // neighbour's score instead would need CAP_SYS_RESOURCE).
    let _ = vrange_testkit::hog::prefer_oom_kill();
    let (region, mut partner) = if shared {
        match shared_region(chunks as usize, end) {
            Ok((r, p)) => (Some(r), Some(p)),
            Err(e) => {
                eprintln!("participant {index}: {e}");
                return 1;
            }
        }
    } else {
        (None, None)
    };
    let mut p = Participant {
        index,
        slots: (0..chunks).map(|_| Slot::default()).collect(),
        volatile,
        shared: region,
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
    let zipf = Zipf::new(p.slots.len(), ZIPF);
    let mut rng = Rng::new(now_ns() ^ (index << 32));
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
            let k = zipf.sample(&mut rng);
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
            println!("{}", c.line(sec));
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
    if let Some(partner) = partner.as_mut() {
        let _ = partner.wait();
    }
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
}
