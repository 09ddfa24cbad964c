//! Watching, without sleeping, for something expected within microseconds:
//! a worker waiting for a reply, and a van's receive thread after a message
//! (the next one, such as a worker's pull behind its push, usually follows at
//! once). A sleeping thread is woken much later than one that watches (on a VM
//! an idle CPU must be woken first), so a 1-element push + pull takes less than
//! half the time on an idle machine.
//!
//! A watching thread yields the CPU between two looks (libzmq's I/O thread,
//! which moves the message, must run too). When other threads want the CPU,
//! a yield hands it over for a whole time slice (milliseconds), and a thread
//! that yielded has no claim on the CPU when its message comes, whereas a
//! sleeping thread that the message wakes runs first: on a loaded machine,
//! watching makes every wait longer (a 1-element push + pull 2-3 times). So a
//! yield that takes longer than [`SLOW_YIELD`] ends the watch, and nobody in
//! the process watches for [`QUIET`] after it; each look costs at most [`SPIN`]
//! of CPU.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a watch lasts at most.
pub(crate) const SPIN: Duration = Duration::from_micros(250);
/// A yield that took this long handed the CPU over for a time slice: a
/// thread that computes wanted it. Yields to the short-running threads of a
/// cluster on one machine (libzmq's I/O threads, a server's receive thread)
/// take tens of microseconds; taking those for a busy machine (a 50 us
/// threshold) turned the watch off on an idle 2-core machine and doubled the
/// 1-element push + pull (385 us against 163-220 us).
pub(crate) const SLOW_YIELD: Duration = Duration::from_millis(1);
/// How long nobody watches after a slow yield.
pub(crate) const QUIET: Duration = Duration::from_millis(100);

pub(crate) struct Watcher {
    base: Instant,
    spin: Duration,
    slow: Duration,
    quiet: Duration,
    /// Until when (ns since `base`) nobody watches.
    quiet_until: AtomicU64,
}

impl Watcher {
    fn new(spin: Duration, slow: Duration, quiet: Duration) -> Watcher {
        Watcher {
            base: Instant::now(),
            spin,
            slow,
            quiet,
            quiet_until: AtomicU64::new(0),
        }
    }

    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// Looks at `ready` until it says true (then true), for up to the
    /// watch's length, yielding the CPU between two looks; false if it did
    /// not. While watching is off (after a slow yield), looks once.
    pub(crate) fn watch(&self, ready: impl FnMut() -> bool) -> bool {
        self.watch_with(ready, std::thread::yield_now)
    }

    fn watch_with(&self, mut ready: impl FnMut() -> bool, mut yield_cpu: impl FnMut()) -> bool {
        let t0 = Instant::now();
        if self.ns(t0) < self.quiet_until.load(Ordering::Relaxed) {
            return ready();
        }
        loop {
            if ready() {
                return true;
            }
            let t = Instant::now();
            if t.saturating_duration_since(t0) >= self.spin {
                return false;
            }
            yield_cpu();
            let after = Instant::now();
            if after.saturating_duration_since(t) >= self.slow {
                self.quiet_until
                    .fetch_max(self.ns(after + self.quiet), Ordering::Relaxed);
                return ready();
            }
        }
    }
}

/// The process's watcher: a slow yield anywhere turns watching off everywhere
/// (the machine is busy, not the thread).
pub(crate) fn watcher() -> &'static Watcher {
    static W: OnceLock<Watcher> = OnceLock::new();
    W.get_or_init(|| Watcher::new(SPIN, SLOW_YIELD, QUIET))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_watch_ends_when_ready() {
        let w = Watcher::new(Duration::from_secs(60), Duration::from_secs(60), QUIET);
        let (looks, yields) = (Cell::new(0), Cell::new(0));
        let ready = || {
            looks.set(looks.get() + 1);
            looks.get() == 5
        };
        assert!(w.watch_with(ready, || yields.set(yields.get() + 1)));
        assert_eq!((looks.get(), yields.get()), (5, 4));
    }

    #[test]
    fn a_watch_ends_after_its_length() {
        let w = Watcher::new(Duration::from_millis(2), Duration::from_secs(60), QUIET);
        let t0 = Instant::now();
        assert!(!w.watch(|| false));
        assert!(t0.elapsed() >= Duration::from_millis(2));
    }

    #[test]
    fn a_slow_yield_stops_watching_for_a_while() {
        let slow = Duration::from_millis(1);
        let w = Watcher::new(Duration::from_secs(60), slow, Duration::from_secs(60));
        let (looks, yields) = (Cell::new(0), Cell::new(0));
        // a yield that gives the CPU away for longer than `slow`
        let descheduled = || {
            yields.set(yields.get() + 1);
            std::thread::sleep(slow * 2);
        };
        let never = || {
            looks.set(looks.get() + 1);
            false
        };
        assert!(!w.watch_with(never, descheduled));
        assert_eq!((looks.get(), yields.get()), (2, 1));
        // the next watch looks once, without yielding
        assert!(!w.watch_with(never, descheduled));
        assert_eq!((looks.get(), yields.get()), (3, 1));
        assert!(w.watch_with(|| true, descheduled));
        assert_eq!(yields.get(), 1);
    }

    #[test]
    fn watching_resumes_after_the_quiet_time() {
        let slow = Duration::from_millis(1);
        let w = Watcher::new(Duration::from_secs(60), slow, Duration::ZERO);
        let yields = Cell::new(0);
        let descheduled = || {
            yields.set(yields.get() + 1);
            std::thread::sleep(slow * 2);
        };
        assert!(!w.watch_with(|| false, descheduled));
        assert!(!w.watch_with(|| false, descheduled));
        assert_eq!(yields.get(), 2);
    }
}
