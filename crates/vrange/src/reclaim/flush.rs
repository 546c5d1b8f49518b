//! Flush hooks: a client that defers marking (a cache keeps a slab pinned for up to a tick
//! after its last reader let go, so that a hit changes no range state) registers a function
//! that marks what it deferred. The reclaimer thread calls every hook at each tick, and every
//! purge calls them first, so deferred memory is volatile by the time victims are chosen. The
//! one exception is memory another thread's flush is marking at that moment (a hook takes its
//! list whole): that purge misses it, the other flush marks it, and the next purge takes it.
//! Waiting for the other flush instead could deadlock: a purge may start inside a client's
//! lock (a mark that catches up on the budget) that the other flush's hook needs.

use std::cell::Cell;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use vrange_sys::lock::{Rank, RankedMutex};

type Hook = Arc<dyn Fn() + Send + Sync>;

static HOOKS: RankedMutex<Vec<(usize, Hook)>> = RankedMutex::new(Rank::FlushHooks, Vec::new());
static LIVE: AtomicUsize = AtomicUsize::new(0);
static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

thread_local!(static RUNNING: Cell<bool> = const { Cell::new(false) });

/// A registered flush hook ([`on_flush`](crate::reclaimer::on_flush)); dropping it unregisters the hook.
#[derive(Debug)]
pub struct FlushHook {
    id: usize,
}

/// What [`crate::reclaimer::on_flush`] does, after it has registered the fork handlers.
pub fn on_flush(f: impl Fn() + Send + Sync + 'static) -> FlushHook {
    let id = NEXT_ID.fetch_add(1, Relaxed);
    let mut hooks = HOOKS.lock();
    hooks.push((id, Arc::new(f)));
    LIVE.store(hooks.len(), Relaxed);
    FlushHook { id }
}

impl Drop for FlushHook {
    fn drop(&mut self) {
        let mut hooks = HOOKS.lock();
        hooks.retain(|(id, _)| *id != self.id);
        LIVE.store(hooks.len(), Relaxed);
    }
}

/// Calls every hook (outside the list's lock, so that a hook may be dropped meanwhile), unless
/// this thread is already inside one (a hook's mark that catches up on the budget purges).
pub(crate) fn run() {
    if LIVE.load(Relaxed) == 0 || RUNNING.with(Cell::get) {
        return;
    }
    let hooks: Vec<Hook> = match HOOKS.try_lock() {
        Some(h) => h.iter().map(|(_, f)| f.clone()).collect(),
        None => return,
    };
    RUNNING.with(|r| r.set(true));
    for f in hooks {
        f();
    }
    RUNNING.with(|r| r.set(false));
}
