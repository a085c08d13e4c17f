//! A global allocator that caps the live heap of a renderer process.
//!
//! MiniJinja bounds instructions (fuel) and `*` repetition, but not the size of values: a string
//! that doubles on each of 31 loop iterations reaches 2 GiB in a few hundred instructions. Rust
//! cannot recover from a failed allocation (it aborts), so the cap is only switched on in the
//! renderer process, which then exits with [`HEAP_CAP_EXIT_CODE`]: one render ends, and the
//! worker starts a new renderer. In the worker itself the allocator is the system allocator plus
//! one relaxed load per call.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

/// The system allocator with an optional cap on live bytes (see `enforce`).
///
/// Install it in a binary that renders chat templates in a child process:
/// `#[global_allocator] static ALLOCATOR: BudgetAllocator = BudgetAllocator;`
#[derive(Debug, Default, Clone, Copy)]
pub struct BudgetAllocator;

/// Whether the cap is on (only in a renderer process).
static ENFORCED: AtomicBool = AtomicBool::new(false);
/// Bytes that may still be allocated while the cap is on. Blocks allocated before it was switched
/// on and freed after it give their bytes back too: the cap is then a little looser, never
/// tighter.
static REMAINING: AtomicIsize = AtomicIsize::new(isize::MAX);

/// How a renderer that went past its heap cap exits: the worker tells this apart from a crash.
pub const HEAP_CAP_EXIT_CODE: i32 = 86;

/// Caps this process's live heap at about `bytes` from now on; an allocation past it ends the
/// process with [`HEAP_CAP_EXIT_CODE`]. Returns whether [`BudgetAllocator`] is this process's allocator, i.e.
/// whether the cap works at all.
pub fn enforce(bytes: usize) -> bool {
    REMAINING.store(
        isize::try_from(bytes).unwrap_or(isize::MAX),
        Ordering::Relaxed,
    );
    ENFORCED.store(true, Ordering::Relaxed);
    let before = REMAINING.load(Ordering::Relaxed);
    let probe = std::hint::black_box(vec![0u8; 4096]);
    let counted = REMAINING.load(Ordering::Relaxed) < before;
    drop(probe);
    counted
}

/// Takes `size` bytes from the budget; ends the process when it would go past it.
fn take(size: usize) {
    if ENFORCED.load(Ordering::Relaxed)
        && REMAINING.fetch_sub(size as isize, Ordering::Relaxed) < size as isize
    {
        // SAFETY: `_exit` ends the process without running Rust or C cleanup, which could
        // allocate again from inside this allocator; nothing is left to flush (replies are
        // flushed as they are written).
        unsafe { libc::_exit(HEAP_CAP_EXIT_CODE) }
    }
}

/// Returns `size` bytes to the budget.
fn give(size: usize) {
    if ENFORCED.load(Ordering::Relaxed) {
        REMAINING.fetch_add(size as isize, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so it upholds
// `GlobalAlloc`'s contract as `System` does; the budget only counts, or ends the process.
unsafe impl GlobalAlloc for BudgetAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        take(layout.size());
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        let block = unsafe { System.alloc(layout) };
        if block.is_null() {
            give(layout.size());
        }
        block
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        take(layout.size());
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc_zeroed` requires.
        let block = unsafe { System.alloc_zeroed(layout) };
        if block.is_null() {
            give(layout.size());
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: `block` was allocated by `System` (through this allocator) with `layout`.
        unsafe { System.dealloc(block, layout) };
        give(layout.size());
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let grows_by = new_size.saturating_sub(layout.size());
        take(grows_by);
        // SAFETY: `block` was allocated by `System` with `layout`; `new_size` is the caller's,
        // valid as `GlobalAlloc::realloc` requires.
        let moved = unsafe { System.realloc(block, layout, new_size) };
        if moved.is_null() {
            give(grows_by);
        } else {
            give(layout.size().saturating_sub(new_size));
        }
        moved
    }
}
