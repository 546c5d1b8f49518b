//! Starving one thread of this process, deterministically: the scheduler cannot run it while
//! the calling thread works. For tests of what vrange does when its reclaimer thread falls
//! behind (a busy machine does this at random; a test needs it every time).

use std::io;

/// While alive, the calling thread runs `SCHED_FIFO` on one CPU and the starved thread may run
/// on that CPU only: it gets no time until the guard is dropped (or the kernel's real-time
/// throttling gives it a slice, after 0.95 s). Dropping restores both threads.
pub struct Starved {
    tid: libc::pid_t,
}

/// The thread of this process named `name` (its `comm`), if there is one.
pub fn thread_named(name: &str) -> Option<libc::pid_t> {
    use vrange_sys::procfs;
    let tid = procfs::tasks(None)
        .ok()?
        .into_iter()
        .find(|&tid| procfs::task_comm(None, tid).is_ok_and(|comm| comm == name))?;
    libc::pid_t::try_from(tid).ok()
}

fn pin(tid: libc::pid_t, cpu: usize) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET checks cpu against the set's size.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: set is a valid cpu_set_t of the size passed.
    let r = unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn unpin(tid: libc::pid_t) {
    // SAFETY: as in `pin`; every CPU the set can name.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in 0..libc::CPU_SETSIZE as usize {
        // SAFETY: cpu is below CPU_SETSIZE, inside the set.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: as in `pin`; the kernel keeps the CPUs that exist.
    unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) };
}

fn set_fifo(fifo: bool) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: i32::from(fifo),
    };
    let policy = if fifo {
        libc::SCHED_FIFO
    } else {
        libc::SCHED_OTHER
    };
    // SAFETY: param is a valid sched_param; pid 0 is the calling thread.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Starves thread `tid` of this process while the guard lives (see [`Starved`]).
///
/// # Errors
/// The error of `sched_setaffinity` or `sched_setscheduler` (`EPERM` without CAP_SYS_NICE);
/// nothing stays changed then.
pub fn starve(tid: libc::pid_t) -> io::Result<Starved> {
    let cpu = vrange_sys::process::current_cpu().ok_or_else(io::Error::last_os_error)?;
    pin(0, cpu)?;
    let guard = Starved { tid };
    pin(tid, cpu)?;
    set_fifo(true)?;
    Ok(guard)
}

impl Drop for Starved {
    fn drop(&mut self) {
        let _ = set_fifo(false);
        unpin(self.tid);
        unpin(0);
    }
}
