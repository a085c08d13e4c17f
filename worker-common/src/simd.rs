//! Scans of a logits row compiled twice: for AVX2, chosen at run time where the CPU has it, and
//! for the baseline x86-64 (SSE2) the crate is built for. The scans use comparisons and
//! selections only, so both builds give the same answers.

/// `fn $name($arg: $ty) -> $ret`: `$body` (an `#[inline(always)]` function, so that it is
/// compiled with the features of the function it lands in) run by an AVX2-compiled copy where
/// the CPU has AVX2, as is otherwise.
macro_rules! avx2_where_present {
    ($(#[$doc:meta])* fn $name:ident($arg:ident: $ty:ty) -> $ret:ty = $body:path;) => {
        $(#[$doc])*
        fn $name($arg: $ty) -> $ret {
            /// `$body` compiled with AVX2.
            ///
            /// # Safety
            ///
            /// The CPU must have AVX2.
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2")]
            unsafe fn avx2($arg: $ty) -> $ret {
                $body($arg)
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: AVX2 was detected on this CPU.
                return unsafe { avx2($arg) };
            }
            $body($arg)
        }
    };
}

pub(crate) use avx2_where_present;
