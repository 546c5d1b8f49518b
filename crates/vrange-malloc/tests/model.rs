//! Property test: random sequences of allocator actions, checked against a simple model of
//! live blocks (each filled with its own byte). After every action: no two live blocks overlap,
//! every block is aligned as asked, every live block still holds its content, zeroed
//! allocations read zero. Purges run the real reclaimer path (MADV_DONTNEED on free spans), so
//! a purge that touched live memory would show up as lost content.

// ci: guest 6.1 only: the allocator on 6.12 takes the host's paths but PT_RECLAIM's, and 6.1 has every fallback

use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout};
use vrange_malloc::VrangeMalloc;

const A: VrangeMalloc = VrangeMalloc;

#[derive(Debug, Clone)]
enum Action {
    Alloc { size: usize, align_shift: u32 },
    Zeroed { size: usize },
    Free { pick: usize },
    Realloc { pick: usize, size: usize },
    Purge,
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        1usize..64 << 10,              // below the threshold: the system allocator
        (64usize << 10)..(1 << 20),    // chunk blocks
        (1usize << 20)..(2 << 20) + 1, // up to a whole chunk
        (2usize << 20)..(7 << 20),     // large blocks
    ]
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => (size(), 3u32..22).prop_map(|(size, align_shift)| Action::Alloc { size, align_shift }),
        2 => size().prop_map(|size| Action::Zeroed { size }),
        4 => any::<usize>().prop_map(|pick| Action::Free { pick }),
        2 => (any::<usize>(), size()).prop_map(|(pick, size)| Action::Realloc { pick, size }),
        1 => Just(Action::Purge),
    ]
}

struct Live {
    ptr: *mut u8,
    layout: Layout,
    byte: u8,
}

fn holds(l: &Live) -> bool {
    // SAFETY: a live block of layout.size() bytes.
    let s = unsafe { std::slice::from_raw_parts(l.ptr, l.layout.size()) };
    // Every byte would be slow on megabytes: check a byte per 1 KiB and both ends.
    s.iter().step_by(1024).all(|b| *b == l.byte) && s[s.len() - 1] == l.byte
}

fn check(live: &[Live]) -> Result<(), TestCaseError> {
    let mut spans: Vec<(usize, usize)> = live
        .iter()
        .map(|l| (l.ptr as usize, l.ptr as usize + l.layout.size()))
        .collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        prop_assert!(w[0].1 <= w[1].0, "blocks overlap: {:x?} {:x?}", w[0], w[1]);
    }
    for l in live {
        prop_assert_eq!(l.ptr as usize % l.layout.align(), 0);
        prop_assert!(
            holds(l),
            "a live block lost its content ({} bytes)",
            l.layout.size()
        );
    }
    Ok(())
}

fn run(actions: Vec<Action>) -> Result<(), TestCaseError> {
    let mut live: Vec<Live> = Vec::new();
    let mut next_byte = 1u8;
    let mut fill = |ptr: *mut u8, len: usize| {
        next_byte = next_byte.wrapping_add(1).max(1);
        // SAFETY: a live block of len bytes.
        unsafe { ptr.write_bytes(next_byte, len) };
        next_byte
    };
    for a in actions {
        match a {
            Action::Alloc { size, align_shift } => {
                let layout = Layout::from_size_align(size, 1 << align_shift).unwrap();
                // SAFETY: size is non-zero.
                let ptr = unsafe { A.alloc(layout) };
                prop_assert!(!ptr.is_null());
                let byte = fill(ptr, size);
                live.push(Live { ptr, layout, byte });
            }
            Action::Zeroed { size } => {
                let layout = Layout::from_size_align(size, 16).unwrap();
                // SAFETY: size is non-zero.
                let ptr = unsafe { A.alloc_zeroed(layout) };
                prop_assert!(!ptr.is_null());
                // SAFETY: a fresh block of size bytes.
                let s = unsafe { std::slice::from_raw_parts(ptr, size) };
                prop_assert!(s.iter().all(|b| *b == 0), "zeroed allocation not zero");
                let byte = fill(ptr, size);
                live.push(Live { ptr, layout, byte });
            }
            Action::Free { pick } if !live.is_empty() => {
                let l = live.swap_remove(pick % live.len());
                prop_assert!(holds(&l));
                // SAFETY: live, with its layout, freed once.
                unsafe { A.dealloc(l.ptr, l.layout) };
            }
            Action::Realloc { pick, size } if !live.is_empty() => {
                let i = pick % live.len();
                let l = &mut live[i];
                let keep = l.layout.size().min(size);
                // SAFETY: live with its layout; size is non-zero.
                let ptr = unsafe { A.realloc(l.ptr, l.layout, size) };
                prop_assert!(!ptr.is_null());
                // SAFETY: the new block holds at least `keep` bytes copied from the old.
                let s = unsafe { std::slice::from_raw_parts(ptr, keep) };
                prop_assert!(s.iter().all(|b| *b == l.byte), "realloc lost content");
                l.ptr = ptr;
                l.layout = Layout::from_size_align(size, l.layout.align()).unwrap();
                l.byte = fill(ptr, size);
            }
            Action::Purge => {
                vrange::purge(usize::MAX);
            }
            Action::Free { .. } | Action::Realloc { .. } => {}
        }
        check(&live)?;
    }
    for l in live {
        // SAFETY: live, with its layout, freed once.
        unsafe { A.dealloc(l.ptr, l.layout) };
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 256, ..ProptestConfig::default() })]

    #[test]
    fn allocator_matches_the_model(actions in prop::collection::vec(action(), 1..120)) {
        run(actions)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Impossible sizes are refused (`None`: the shim then sends them to glibc, which fails
    /// with ENOMEM), never wrapped into a small block: every size from the address space's
    /// size up to `usize::MAX`, at every alignment the allocator serves; and growing a live
    /// block in place to such a size fails and leaves it as it was.
    #[test]
    fn impossible_sizes_are_refused_not_wrapped(
        size in (1usize << 47)..=usize::MAX,
        align_shift in 0u32..=21,
    ) {
        use vrange_malloc::heap;
        let align = 1usize << align_shift;
        prop_assert!(heap::alloc(size, align).is_none(), "alloc({}, {})", size, align);
        let live = heap::alloc(64 << 10, 16).expect("served").ptr.as_ptr();
        // SAFETY: live is a block of this allocator, freed once below.
        let grown = unsafe { heap::resize_in_place(live, size) };
        prop_assert!(!grown, "grown in place to {}", size);
        prop_assert_eq!(heap::usable_size(live), Some(64 << 10));
        // SAFETY: as above.
        let freed = unsafe { heap::free(live) };
        prop_assert!(freed);
    }
}
