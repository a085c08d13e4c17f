//! The compute threads of a forward pass: the calling thread and `threads − 1` workers that
//! share each parallel region's tasks.
//!
//! A step is a few hundred short regions (the matrix products, attention, the per-row work of
//! a batch), each a few to a few hundred microseconds. A rayon region costs about 2 µs over
//! its work on a two-core VM (injecting the job, waking a sleeping thread, joining), where one
//! cache line takes about 170 ns from one core to the other. Here a region is published with
//! a few stores; each thread takes the tasks of its own share from a counter on its own cache
//! line, and only then helps the others with theirs, so claims rarely move a line; idle
//! workers spin between the regions of a step.
//!
//! The caller never waits for a worker that has not started: it takes a late worker's share
//! itself and waits only for tasks already claimed, so a worker the host has descheduled costs
//! only its part of the parallelism. Idle workers spin for a while, then yield, then sleep
//! until the next region.
//!
//! Which thread runs a task does not change what it computes: every output is written by
//! exactly one task, in an order fixed by the task, so results do not depend on the threads.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker keeps spinning (then yielding) before it sleeps: longer than the
/// gaps between a step's regions, short enough that an idle one gives its core back almost at
/// once.
const SPIN: Duration = Duration::from_micros(50);
const YIELD: Duration = Duration::from_micros(500);

/// Looks at the region counter between two reads of the clock.
const CHECKS_PER_CLOCK: usize = 64;

/// Most tasks of one region (a share counter holds them in 16 bits); [`Team::run`] runs more
/// as several regions.
const MAX_TASKS: usize = u16::MAX as usize;

/// A region's task body.
type Body<'a> = dyn Fn(usize) + Sync + 'a;

/// The calling thread and the workers of one backend.
pub struct Team {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Held while a region runs, so a second caller runs its region alone instead of mixing
    /// its tasks into the first's.
    running: Mutex<()>,
}

impl std::fmt::Debug for Team {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Team")
            .field("threads", &self.threads())
            .finish()
    }
}

/// A value alone on its cache lines (two: the adjacent-line prefetcher pairs them), so the
/// threads writing it do not also invalidate their neighbours' reads.
#[repr(align(128))]
struct Line<T>(T);

impl<T> std::ops::Deref for Line<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// What the caller and the workers share.
struct Shared {
    /// The current region, counting up; what idle workers watch.
    region: Line<AtomicU64>,
    /// Per thread, its share of the current region's tasks: [`Share`] packed.
    shares: Box<[Line<AtomicU64>]>,
    /// Tasks of the current region finished, added by each thread once it has no more to claim.
    done: Line<AtomicUsize>,
    /// The current region's body, a pointer to the caller's `&Body`, valid while the region
    /// has unfinished claimed tasks.
    body: AtomicPtr<&'static Body<'static>>,
    /// The first panic of a task of the current region.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Workers asleep; the lock the caller takes to wake them.
    sleepers: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
    stop: AtomicBool,
}

/// One thread's share of a region's tasks: `next..end`, claimed from the front.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Share {
    /// The region's number, low 32 bits: a claim made for another region fails.
    region: u32,
    next: u16,
    end: u16,
}

impl Share {
    fn pack(self) -> u64 {
        (u64::from(self.region) << 32) | (u64::from(self.next) << 16) | u64::from(self.end)
    }

    fn unpack(word: u64) -> Self {
        Self {
            region: (word >> 32) as u32,
            next: (word >> 16) as u16,
            end: word as u16,
        }
    }
}

impl Team {
    /// A team of `threads` (≥ 1) threads: the caller of [`Team::run`] and `threads − 1`
    /// workers started now.
    pub fn new(threads: usize) -> std::io::Result<Self> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            region: Line(AtomicU64::new(0)),
            shares: (0..threads).map(|_| Line(AtomicU64::new(0))).collect(),
            done: Line(AtomicUsize::new(0)),
            body: AtomicPtr::new(std::ptr::null_mut()),
            panic: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let mut team = Self {
            shared,
            workers: Vec::new(),
            running: Mutex::new(()),
        };
        for i in 1..threads {
            let shared = Arc::clone(&team.shared);
            let worker = std::thread::Builder::new()
                .name(format!("cpu-compute-{i}"))
                .spawn(move || shared.work(i))?;
            team.workers.push(worker);
        }
        Ok(team)
    }

    /// Threads running a region's tasks, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `body(i)` for every `i < tasks`, each once, on the caller and the workers, and
    /// returns when all have finished. A panic in a task is raised again here, after the
    /// others finished.
    pub fn run(&self, tasks: usize, body: &(dyn Fn(usize) + Sync)) {
        let guard = match self.running.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        if guard.is_none() || self.workers.is_empty() || tasks <= 1 {
            (0..tasks).for_each(body);
            return;
        }
        for first in (0..tasks).step_by(MAX_TASKS) {
            let count = (tasks - first).min(MAX_TASKS);
            self.region(count, &|i| body(first + i));
        }
    }

    /// One region of `tasks` (at most [`MAX_TASKS`]) tasks.
    fn region(&self, tasks: usize, body: &Body<'_>) {
        let shared = &*self.shared;
        // SAFETY: the region's tasks are the only readers of `body`, through `shared.body`,
        // and each reads it after claiming a task and before counting it done; this function
        // returns only once every task is counted done, and a claim fails once they all
        // were claimed (or once a later region replaced the shares), so no thread reads `body`
        // after it goes out of scope here. The lifetime is erased only to store the pointer.
        let body: &'static Body<'static> = unsafe { std::mem::transmute(body) };
        let region = shared.region.load(Ordering::Relaxed) + 1;
        let threads = shared.shares.len();
        for (k, share) in shared.shares.iter().enumerate() {
            let share_of = |k: usize| (k * tasks / threads) as u16;
            let share_now = Share {
                region: region as u32,
                next: share_of(k),
                end: share_of(k + 1),
            };
            share.store(share_now.pack(), Ordering::Relaxed);
        }
        shared.done.store(0, Ordering::Relaxed);
        shared
            .body
            .store(std::ptr::from_ref(&body).cast_mut(), Ordering::Relaxed);
        // Publishes the shares and the body with the region.
        shared.region.store(region, Ordering::SeqCst);
        if shared.sleepers.load(Ordering::SeqCst) > 0 {
            let _lock = shared.sleep.lock();
            shared.wake.notify_all();
        }
        shared.claim_tasks(region as u32, 0);
        while shared.done.load(Ordering::Acquire) < tasks {
            std::hint::spin_loop();
        }
        let panic = shared.panic.lock().map(|mut p| p.take());
        if let Ok(Some(payload)) = panic {
            resume_unwind(payload);
        }
    }

    /// Runs `body` on every item of `items`, each once, as [`Team::run`] does.
    pub fn for_each<T: Send>(&self, items: &mut [T], body: impl Fn(&mut T) + Sync) {
        let base = Items(items.as_mut_ptr());
        let len = items.len();
        self.run(len, &|i| {
            assert!(i < len);
            // SAFETY: `run` hands each index below `len` to exactly one task, so the `&mut`
            // made here is the only reference to item `i` while `items` is borrowed.
            body(unsafe { &mut *base.at(i) })
        });
    }
}

/// The items of a [`Team::for_each`], handed out one to each task.
struct Items<T>(*mut T);

impl<T> Items<T> {
    /// Item `i`'s place (a method, so closures capture the `Sync` wrapper, not the pointer).
    fn at(&self, i: usize) -> *mut T {
        // SAFETY: `i` is below the slice's length (asserted by the caller).
        unsafe { self.0.add(i) }
    }
}

// SAFETY: each item is reached by one task only (`Team::for_each`), and `T: Send` lets it be
// used from another thread.
unsafe impl<T: Send> Sync for Items<T> {}

impl Shared {
    /// Thread `me`'s part of `region`: its own share's tasks, then what is left of the
    /// others', then the count of those it ran added to `done`.
    fn claim_tasks(&self, region: u32, me: usize) {
        let threads = self.shares.len();
        let mut ran = 0;
        for k in (me..threads).chain(0..me) {
            while let Some(task) = self.claim(&self.shares[k], region) {
                self.run_task(task);
                ran += 1;
            }
        }
        if ran > 0 {
            self.done.fetch_add(ran, Ordering::Release);
        }
    }

    /// The next task of `share` if it still belongs to `region` and has one.
    fn claim(&self, share: &AtomicU64, region: u32) -> Option<usize> {
        let mut word = share.load(Ordering::Acquire);
        loop {
            let now = Share::unpack(word);
            if now.region != region || now.next >= now.end {
                return None;
            }
            let claimed = Share {
                next: now.next + 1,
                ..now
            };
            match share.compare_exchange_weak(
                word,
                claimed.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(usize::from(now.next)),
                Err(current) => word = current,
            }
        }
    }

    /// Runs claimed task `task` of the current region (not yet counted done).
    fn run_task(&self, task: usize) {
        // SAFETY: the task is claimed and not yet counted done, so the caller of `Team::run`
        // is still waiting and its `body` is alive (see there).
        let body = unsafe { *self.body.load(Ordering::Relaxed) };
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| body(task)))
            && let Ok(mut first) = self.panic.lock()
        {
            first.get_or_insert(payload);
        }
    }

    /// Worker `me`'s loop: wait for a region, take part in it, until the team is dropped.
    fn work(&self, me: usize) {
        let mut seen = 0;
        loop {
            let Some(region) = self.next_region(seen) else {
                return;
            };
            seen = region;
            self.claim_tasks(region as u32, me);
        }
    }

    /// Waits for a region after `seen` (spinning, then yielding, then asleep); `None` once
    /// the team stops.
    fn next_region(&self, seen: u64) -> Option<u64> {
        let start = Instant::now();
        let current = || self.region.load(Ordering::SeqCst);
        loop {
            // One pause between looks: a region is seen within a fraction of a microsecond.
            for _ in 0..CHECKS_PER_CLOCK {
                let region = current();
                if region != seen {
                    return Some(region);
                }
                std::hint::spin_loop();
            }
            if self.stop.load(Ordering::Relaxed) {
                return None;
            }
            let idle = start.elapsed();
            if idle < SPIN {
                continue;
            } else if idle < YIELD {
                std::thread::yield_now();
            } else {
                let Ok(lock) = self.sleep.lock() else {
                    return None;
                };
                self.sleepers.fetch_add(1, Ordering::SeqCst);
                // Checked again under the lock: a caller that published after this check
                // sees the sleeper and notifies under the same lock.
                let wait = current() == seen && !self.stop.load(Ordering::SeqCst);
                let lock = if wait {
                    self.wake.wait(lock).ok()
                } else {
                    None
                };
                self.sleepers.fetch_sub(1, Ordering::SeqCst);
                drop(lock);
            }
        }
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _lock = self.shared.sleep.lock();
            self.shared.wake.notify_all();
        }
        for worker in self.workers.drain(..) {
            // A worker only ends by returning (task panics are caught).
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once() {
        for threads in [1, 2, 4] {
            let team = Team::new(threads).unwrap();
            for tasks in [0, 1, 2, 7, 100] {
                let counts: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                for _ in 0..50 {
                    team.run(tasks, &|i| {
                        counts[i].fetch_add(1, Ordering::Relaxed);
                    });
                }
                assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 50));
            }
        }
    }

    #[test]
    fn for_each_gives_each_item_to_one_task() {
        let team = Team::new(3).unwrap();
        let mut items: Vec<usize> = (0..1000).collect();
        team.for_each(&mut items, |v| *v *= 2);
        assert!(items.iter().enumerate().all(|(i, &v)| v == 2 * i));
    }

    #[test]
    fn a_task_panic_reaches_the_caller_and_the_team_goes_on() {
        let team = Team::new(2).unwrap();
        let result = catch_unwind(AssertUnwindSafe(|| {
            team.run(10, &|i| assert!(i != 3, "task three"));
        }));
        assert!(result.is_err());
        let ran = AtomicUsize::new(0);
        team.run(10, &|_| {
            ran.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(ran.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn workers_wake_after_sleeping() {
        let team = Team::new(2).unwrap();
        std::thread::sleep(YIELD * 4);
        let threads = Mutex::new(std::collections::HashSet::new());
        for _ in 0..200 {
            team.run(64, &|_| {
                threads.lock().unwrap().insert(std::thread::current().id());
                std::thread::sleep(Duration::from_micros(20));
            });
            if threads.lock().unwrap().len() == 2 {
                return;
            }
        }
        panic!("the worker never took a task after sleeping");
    }
}
