//! What the loom models share: the `sync` shim a source file of the crate is compiled against
//! (its atomics are loom's inside a model, std's outside), [`check`], which runs a model, and
//! [`both`], which runs a model's two sides.
//!
//! Every side of a model runs in a thread the model spawns, none in the model's own thread:
//! loom 0.7 misses interleavings between the spawning thread and a thread it spawned when the
//! spawned one begins with a load (a store it makes after that load is never tried before the
//! spawner's next access to the same atomic). Two spawned threads are explored in full.

/// Stands in for the crate's `sync` module while one of its files is compiled into a test
/// crate.
///
/// Inside a model (see [`check`]) the word is a loom atomic and a wait step is a loom yield,
/// which tells loom the thread cannot progress until another one does. Outside a model the word
/// is a std atomic: `state.rs` has `#[cfg(test)]` unit tests, which are compiled into this crate
/// too (`cfg(test)` is set for integration tests) and run here outside any model.
///
/// The model's `store` is a `swap`. Loom 0.7 does not keep a plain store out of the middle of
/// a concurrent read-modify-write (tokio-rs/loom#254, #389; fix proposed in #391), so it
/// explores executions real hardware cannot produce: `finish_arm`'s store of `ARMED` lost under
/// an unmark's CAS that sets `CANCEL`, the word left `ARMING|CANCEL` for good and the unmark
/// spinning forever. As a read-modify-write the store takes its place in the modification order
/// like every other write to the word. The swap's read part is as relaxed as the store, and it
/// cannot hide a missing synchronization here: every `store` in `state.rs` writes a word that no
/// other thread may change in between (`PURGING`, `BUSY`), except `finish_arm`, where the only
/// other writer is the owner's cancelling CAS and only that owner acquires the stored `ARMED`.
pub mod sync {
    use std::cell::Cell;

    std::thread_local! {
        static IN_MODEL: Cell<bool> = const { Cell::new(false) };
    }

    /// Whether this thread is running a loom model (loom's threads are coroutines on it).
    pub fn in_model() -> bool {
        IN_MODEL.with(Cell::get)
    }

    /// Marks this thread as running a model until the guard is dropped.
    pub struct ModelGuard(());

    impl ModelGuard {
        pub fn enter() -> ModelGuard {
            IN_MODEL.with(|m| m.set(true));
            ModelGuard(())
        }
    }

    impl Drop for ModelGuard {
        fn drop(&mut self) {
            IN_MODEL.with(|m| m.set(false));
        }
    }

    pub mod atomic {
        pub use std::sync::atomic::Ordering;

        /// A loom atomic inside a model, a std one outside (see the module documentation).
        /// The model's `store` is a `swap` (see there).
        macro_rules! dual {
            ($name:ident, $model:ty, $plain:ty, $t:ty) => {
                #[derive(Debug)]
                pub struct $name(Inner);

                #[derive(Debug)]
                enum Inner {
                    Model($model),
                    Plain($plain),
                }

                #[allow(dead_code)] // each model uses some
                impl $name {
                    pub fn new(value: $t) -> $name {
                        $name(if crate::loom_shim::sync::in_model() {
                            Inner::Model(<$model>::new(value))
                        } else {
                            Inner::Plain(<$plain>::new(value))
                        })
                    }

                    pub fn load(&self, order: Ordering) -> $t {
                        match &self.0 {
                            Inner::Model(a) => a.load(order),
                            Inner::Plain(a) => a.load(order),
                        }
                    }

                    pub fn store(&self, value: $t, order: Ordering) {
                        match &self.0 {
                            Inner::Model(a) => {
                                a.swap(value, order);
                            }
                            Inner::Plain(a) => a.store(value, order),
                        }
                    }

                    pub fn swap(&self, value: $t, order: Ordering) -> $t {
                        match &self.0 {
                            Inner::Model(a) => a.swap(value, order),
                            Inner::Plain(a) => a.swap(value, order),
                        }
                    }

                    pub fn compare_exchange(
                        &self,
                        current: $t,
                        new: $t,
                        success: Ordering,
                        failure: Ordering,
                    ) -> Result<$t, $t> {
                        match &self.0 {
                            Inner::Model(a) => a.compare_exchange(current, new, success, failure),
                            Inner::Plain(a) => a.compare_exchange(current, new, success, failure),
                        }
                    }
                }
            };
        }

        /// [`dual`] with the arithmetic of an integer atomic.
        macro_rules! dual_int {
            ($name:ident, $t:ty) => {
                dual!(
                    $name,
                    loom::sync::atomic::$name,
                    std::sync::atomic::$name,
                    $t
                );

                #[allow(dead_code)] // each model uses some
                impl $name {
                    pub fn fetch_add(&self, value: $t, order: Ordering) -> $t {
                        match &self.0 {
                            Inner::Model(a) => a.fetch_add(value, order),
                            Inner::Plain(a) => a.fetch_add(value, order),
                        }
                    }

                    pub fn fetch_sub(&self, value: $t, order: Ordering) -> $t {
                        match &self.0 {
                            Inner::Model(a) => a.fetch_sub(value, order),
                            Inner::Plain(a) => a.fetch_sub(value, order),
                        }
                    }

                    pub fn fetch_max(&self, value: $t, order: Ordering) -> $t {
                        match &self.0 {
                            Inner::Model(a) => a.fetch_max(value, order),
                            Inner::Plain(a) => a.fetch_max(value, order),
                        }
                    }

                    pub fn fetch_and(&self, value: $t, order: Ordering) -> $t {
                        match &self.0 {
                            Inner::Model(a) => a.fetch_and(value, order),
                            Inner::Plain(a) => a.fetch_and(value, order),
                        }
                    }
                }
            };
        }

        pub mod u8 {
            use super::Ordering;
            dual_int!(AtomicU8, u8);
        }
        pub mod u32 {
            use super::Ordering;
            dual_int!(AtomicU32, u32);
        }
        pub mod u64 {
            use super::Ordering;
            dual_int!(AtomicU64, u64);
        }
        pub mod usize {
            use super::Ordering;
            dual_int!(AtomicUsize, usize);
        }
        pub mod ptr {
            use super::Ordering;
            dual!(
                AtomicUnitPtr,
                loom::sync::atomic::AtomicPtr<()>,
                std::sync::atomic::AtomicPtr<()>,
                *mut ()
            );
        }
        #[allow(unused_imports)] // each model uses some
        pub use self::u32::AtomicU32;
        #[allow(unused_imports)]
        pub use self::u64::AtomicU64;
        #[allow(unused_imports)]
        pub use self::u8::AtomicU8;
        #[allow(unused_imports)]
        pub use self::usize::AtomicUsize;

        /// `AtomicPtr<T>` for the pointers the models store (kept as `*mut ()`).
        #[derive(Debug)]
        pub struct AtomicPtr<T>(ptr::AtomicUnitPtr, std::marker::PhantomData<*mut T>);

        // SAFETY: as std's AtomicPtr: the pointer is only moved between threads, never read.
        unsafe impl<T> Sync for AtomicPtr<T> {}
        // SAFETY: as above.
        unsafe impl<T> Send for AtomicPtr<T> {}

        #[allow(dead_code)] // each model uses some
        impl<T> AtomicPtr<T> {
            pub fn new(p: *mut T) -> AtomicPtr<T> {
                AtomicPtr(ptr::AtomicUnitPtr::new(p.cast()), std::marker::PhantomData)
            }

            pub fn load(&self, order: Ordering) -> *mut T {
                self.0.load(order).cast()
            }

            pub fn store(&self, p: *mut T, order: Ordering) {
                self.0.store(p.cast(), order)
            }

            pub fn swap(&self, p: *mut T, order: Ordering) -> *mut T {
                self.0.swap(p.cast(), order).cast()
            }
        }
    }
    /// Rounds of one wait that the model explores every alternative of; see [`backoff`].
    const SPIN_ROUNDS: u32 = 4;

    /// One step of waiting. In the model, a wait that has gone on for [`SPIN_ROUNDS`] rounds
    /// stops loom exploring alternatives from there on: the execution still runs to its end
    /// (loom's default choice schedules the thread that has yielded least, so the wait ends
    /// unless nothing can make progress, which loom still reports as exceeding its branch
    /// limit), but the interleavings that would branch off it are the ones of an execution
    /// with fewer idle rounds, which are explored anyway. Without this two threads waiting on
    /// the same `PURGING` word can hand the processor to each other forever and never to the
    /// purger, a schedule loom counts no preemption for.
    pub fn backoff(round: &mut u32) {
        *round = round.saturating_add(1);
        if in_model() {
            if *round > SPIN_ROUNDS {
                loom::skip_branch();
            }
            loom::thread::yield_now();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Explores `f` with at most `preemptions` preemptions per execution (`None`: all executions),
/// or as many as `LOOM_MAX_PREEMPTIONS` says.
pub fn check<F>(preemptions: Option<usize>, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = preemptions;
    }
    let _model = sync::ModelGuard::enter();
    builder.check(move || {
        // The word must be loom's: a model on another OS thread would silently test std's.
        assert!(
            sync::in_model(),
            "loom ran the model off the calling thread"
        );
        f()
    });
}

/// Runs `a` and `b` in two threads of the model (see the module documentation) and returns
/// what each returned.
pub fn both<A, B>(
    a: impl FnOnce() -> A + Send + 'static,
    b: impl FnOnce() -> B + Send + 'static,
) -> (A, B)
where
    A: Send + 'static,
    B: Send + 'static,
{
    let a = loom::thread::spawn(a);
    let b = loom::thread::spawn(b);
    (a.join().unwrap(), b.join().unwrap())
}
