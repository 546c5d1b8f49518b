//! A coordinator (`vrange daemon`'s library) in a thread of this process, for the suites that
//! run one beside their services (coordinate, proactive).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A coordinator in a thread of this process.
pub(crate) struct InProcess {
    pub(crate) shared: Arc<vrange_coordinator::Shared>,
    pub(crate) thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl InProcess {
    /// Starts one with `opts` and waits until it answers at its socket.
    pub(crate) fn start(opts: vrange_coordinator::Options) -> Result<InProcess, String> {
        let socket = opts.socket.clone();
        let shared = Arc::new(vrange_coordinator::Shared::default());
        let s = shared.clone();
        let thread = std::thread::spawn(move || vrange_coordinator::run(&opts, &s));
        let mut c = InProcess {
            shared,
            thread: Some(thread),
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while vrange_coordinator::query(&socket).is_err() {
            if c.thread.as_ref().is_some_and(|t| t.is_finished()) || Instant::now() > deadline {
                return Err(format!("the coordinator did not start: {}", c.stop()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(c)
    }

    /// A metric of the last snapshot.
    pub(crate) fn metric(&self, name: &str) -> Option<f64> {
        let text = self.shared.metrics();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// Stops it; says how it ended.
    pub(crate) fn stop(&mut self) -> String {
        self.shared.stop.store(true, Relaxed);
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(Ok(()))) | None => "stopped".into(),
            Some(Ok(Err(e))) => e.to_string(),
            Some(Err(_)) => "panicked".into(),
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.stop();
    }
}
