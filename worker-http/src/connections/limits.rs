//! How many connections the worker keeps and for how long.

use std::time::Duration;

/// Descriptors kept back from the connection limit for the model file, logs, the engine and the
/// runtime.
const DESCRIPTORS_KEPT: u64 = 64;
/// The default limit never exceeds this, whatever the descriptor limit.
const DEFAULT_MAX: u64 = 4096;
/// The smallest limit that still leaves general places besides the reserve.
pub const MIN_CONNECTIONS: usize = 8;

/// The connection limits of a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most connections open at once.
    pub max: usize,
    /// Of `max`, the places job routes may never hold: kept for `/health` and `/metrics`.
    pub reserve: usize,
    /// Time allowed for a request head, from the connection's opening or its previous response.
    pub idle_timeout: Duration,
    /// A connection whose writes are refused this long is dropped (its client stopped reading).
    pub stream_stall: Duration,
}

impl ConnectionLimits {
    /// The limits for `max` connections (or the default sized from the descriptor limit).
    pub fn new(max: Option<usize>, idle_timeout: Duration, stream_stall: Duration) -> Self {
        let max = max
            .unwrap_or_else(|| default_max(descriptor_limit()))
            .max(MIN_CONNECTIONS);
        Self {
            max,
            reserve: reserve_for(max),
            idle_timeout,
            stream_stall,
        }
    }

    /// The places requests for job routes (every route but `/health` and `/metrics`) may hold.
    pub fn job_places(&self) -> usize {
        self.max - self.reserve
    }

    /// Lowers the limit to what a descriptor limit of `descriptors` leaves room for, as the
    /// default is sized at start-up; never raises it. Whether it was lowered.
    pub fn fit_descriptors(&mut self, descriptors: u64) -> bool {
        let fits = default_max(descriptors);
        if fits >= self.max {
            return false;
        }
        self.max = fits;
        self.reserve = reserve_for(fits);
        true
    }
}

/// The reserve of a limit of `max`: a sixteenth, 2 to 16.
fn reserve_for(max: usize) -> usize {
    (max / 16).clamp(2, 16)
}

/// The default connection limit under a descriptor limit of `descriptors`.
fn default_max(descriptors: u64) -> usize {
    descriptors
        .saturating_sub(DESCRIPTORS_KEPT)
        .clamp(MIN_CONNECTIONS as u64, DEFAULT_MAX) as usize
}

/// The soft `RLIMIT_NOFILE` of this process (1024, the usual default, when unreadable); read
/// again after `EMFILE`, since another process may have lowered it (`prlimit --pid`).
pub fn descriptor_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes one `rlimit` through a pointer to a live, writable local.
    let status = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if status == 0 { limit.rlim_cur } else { 1024 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_leaves_descriptors_and_stays_bounded() {
        assert_eq!(default_max(1024), 960);
        assert_eq!(default_max(128), 64);
        assert_eq!(default_max(20), MIN_CONNECTIONS);
        assert_eq!(default_max(1 << 20), 4096);
    }

    #[test]
    fn the_reserve_is_a_sixteenth_within_bounds() {
        let limits = |max| ConnectionLimits::new(Some(max), Duration::ZERO, Duration::ZERO);
        assert_eq!(limits(64).reserve, 4);
        assert_eq!(limits(8).reserve, 2);
        assert_eq!(limits(4096).reserve, 16);
        assert_eq!(limits(1).max, MIN_CONNECTIONS);
        assert!(ConnectionLimits::new(None, Duration::ZERO, Duration::ZERO).max >= MIN_CONNECTIONS);
        assert_eq!(limits(960).job_places(), 944);
    }

    #[test]
    fn a_lower_descriptor_limit_lowers_the_limit_and_a_higher_one_never_raises_it() {
        let mut limits = ConnectionLimits::new(Some(960), Duration::ZERO, Duration::ZERO);
        assert!(limits.fit_descriptors(256));
        assert_eq!(
            (limits.max, limits.reserve, limits.job_places()),
            (192, 12, 180)
        );
        assert!(!limits.fit_descriptors(20_000));
        assert!(!limits.fit_descriptors(256));
        assert_eq!(limits.max, 192);
        assert!(limits.fit_descriptors(10));
        assert_eq!((limits.max, limits.reserve), (MIN_CONNECTIONS, 2));
    }
}
