//! The kernel's per-CPU LRU batches: MADV_FREE parks folios (up to 31 per CPU, large ones
//! included) in a batch before they become lazy-free, so a count of lazy-free memory read from
//! another CPU can miss them until something drains that CPU's batch.

/// Drains every CPU's LRU batches (the lazy-free one included): `move_pages(2)` of one page of
/// this process to the node it is already on disables the LRU caches for the call, which
/// drains them all (`lru_cache_disable`, Linux 5.12). Returns whether the call worked (ENOSYS
/// without NUMA support; the batches then drain on their own).
pub fn drain_batches() -> bool {
    let mut page = Box::new([1u8; 8192]);
    let aligned = (page.as_mut_ptr() as usize + 4095) & !4095;
    let pages = [aligned as *mut libc::c_void];
    let move_pages = |nodes: *const i32, status: &mut [i32; 1]| {
        // SAFETY: one page of this process's own memory (pid 0: this process); the arrays
        // live across the call.
        unsafe {
            libc::syscall(
                libc::SYS_move_pages,
                0,
                1usize,
                pages.as_ptr(),
                nodes,
                status.as_mut_ptr(),
                0,
            )
        }
    };
    // Where the page is (nodes NULL: a query, which drains nothing), then a move there.
    let mut status = [-1i32];
    if move_pages(std::ptr::null(), &mut status) != 0 || status[0] < 0 {
        return false;
    }
    let node = [status[0]];
    let moved = move_pages(node.as_ptr(), &mut status) == 0;
    drop(page);
    moved
}

#[cfg(test)]
mod tests {
    use super::*;
    use vrange_sys::mem;

    /// Pins the calling thread to `cpu`; false where it cannot (one CPU, a restricted set).
    fn pin(cpu: usize) -> bool {
        // SAFETY: a zeroed cpu_set_t is empty; the set lives across the call.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    }

    #[test]
    fn pages_freed_lazily_on_another_cpu_count_as_lazy_free_once_drained() {
        const PAGES: usize = 20;
        let page = mem::page_size();
        let len = PAGES * page;
        let map = mem::map_anon(len, page).unwrap();
        let addr = map.as_ptr() as usize;
        // Another CPU frees them lazily (fewer than a batch: they stay in its batch).
        let other = std::thread::spawn(move || {
            if !pin(1) {
                return false;
            }
            let p = addr as *mut u8;
            // SAFETY: the mapping is this test's, `len` bytes long, and nothing else uses it.
            unsafe {
                std::ptr::write_bytes(p, 1, len);
                mem::purge_lazy(p, len).unwrap();
            }
            true
        })
        .join()
        .unwrap();
        if other {
            assert!(pin(0));
            assert!(drain_batches(), "move_pages works on this kernel");
            let lazy = crate::procfs::lazy_free_kb(map.as_ptr());
            assert_eq!(
                lazy,
                (len / 1024) as u64,
                "every page lazy-free after the drain"
            );
        } else {
            crate::skip("one CPU: no other CPU's batch to drain");
        }
        // SAFETY: the mapping is this test's and no longer used.
        unsafe { mem::unmap(map, len) };
    }
}
