//! The instruction set the CPU kernels run with, decided once per process: the best this CPU
//! has, or a lower level named by `LLORCH_CPU_ISA` (`scalar`, `avx2`, `avx512`) so that a
//! machine with AVX-512 can measure and test the AVX2 path. Every kernel's dispatch asks
//! [`active`]; every level computes the same bits as the scalar oracle.

use std::sync::OnceLock;

/// The environment variable that lowers the instruction set.
pub const ENV: &str = "LLORCH_CPU_ISA";

/// An instruction-set level, each including the ones below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust: the reference every other level matches bit for bit.
    Scalar,
    /// AVX2 with FMA and F16C.
    Avx2,
    /// AVX-512F (norms, attention) over AVX2 integer dots.
    Avx512,
    /// AVX-512F with VNNI integer dots (`avx512vnni`, `avx512vl`, `avx512bw`): two row groups
    /// a 512-bit register.
    Avx512Vnni,
}

/// Why `LLORCH_CPU_ISA` cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IsaError {
    /// Not one of the names.
    #[error("{ENV}={0:?} is not an instruction set: use scalar, avx2 or avx512")]
    Unknown(String),
    /// Above what this CPU has.
    #[error("{ENV}={requested} but this CPU has only {detected}: use {detected} or lower")]
    Unsupported {
        /// The requested level's name.
        requested: &'static str,
        /// The best level this CPU has.
        detected: &'static str,
    },
}

impl Isa {
    /// The level's name, as `/health` and the start-up log show it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Vnni => "avx512-vnni",
        }
    }

    /// The best level this CPU has.
    pub fn detected() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            let avx512 = avx2 && is_x86_feature_detected!("avx512f");
            let vnni = avx512
                && is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512bw");
            match (avx2, avx512, vnni) {
                (_, _, true) => Isa::Avx512Vnni,
                (_, true, _) => Isa::Avx512,
                (true, ..) => Isa::Avx2,
                _ => Isa::Scalar,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Scalar
    }

    /// The level `request` (a `LLORCH_CPU_ISA` value; `None` or empty: the best) names on a CPU
    /// whose best is `detected`. `avx512` takes VNNI where the CPU has it.
    pub fn resolve(request: Option<&str>, detected: Isa) -> Result<Isa, IsaError> {
        let requested = match request.map(str::trim) {
            None | Some("") => return Ok(detected),
            Some("scalar") => Isa::Scalar,
            Some("avx2") => Isa::Avx2,
            Some("avx512") if detected == Isa::Avx512Vnni => Isa::Avx512Vnni,
            Some("avx512") => Isa::Avx512,
            Some(other) => return Err(IsaError::Unknown(other.to_owned())),
        };
        if requested > detected {
            return Err(IsaError::Unsupported {
                requested: requested.name(),
                detected: detected.name(),
            });
        }
        Ok(requested)
    }
}

fn from_env() -> Result<Isa, IsaError> {
    Isa::resolve(std::env::var(ENV).ok().as_deref(), Isa::detected())
}

/// The level the kernels use: decided on the first call, from `LLORCH_CPU_ISA` and the CPU.
/// A value [`select`] refuses falls back to the CPU's best here; loading calls [`select`]
/// first, so a worker never runs with one.
pub fn active() -> Isa {
    static ACTIVE: OnceLock<Isa> = OnceLock::new();
    *ACTIVE.get_or_init(|| from_env().unwrap_or_else(|_| Isa::detected()))
}

/// Checks `LLORCH_CPU_ISA` and returns the level the kernels will use.
pub fn select() -> Result<Isa, IsaError> {
    from_env()?;
    Ok(active())
}

/// Whether the AVX2 (+FMA, F16C) kernels run.
pub fn avx2() -> bool {
    active() >= Isa::Avx2
}

/// Whether the AVX-512F loops run.
pub fn avx512() -> bool {
    active() >= Isa::Avx512
}

/// Whether the VNNI integer dots run.
pub fn vnni() -> bool {
    #[cfg(test)]
    if FORCE_AVX2.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    active() == Isa::Avx512Vnni
}

/// Set by [`on_each_simd_path`]: the AVX2 integer dots run even on a VNNI CPU.
#[cfg(test)]
static FORCE_AVX2: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Runs `check` on each integer-dot path this CPU has: VNNI where present, then AVX2 forced.
/// A lock keeps the tests that flip the process-wide switch from overlapping.
#[cfg(test)]
pub(crate) fn on_each_simd_path(check: impl Fn()) {
    use std::sync::atomic::Ordering::Relaxed;
    static SWITCH: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _held = SWITCH
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for force_avx2 in [false, true] {
        FORCE_AVX2.store(force_avx2, Relaxed);
        check();
    }
    FORCE_AVX2.store(false, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_resolve_against_the_cpu() {
        use Isa::*;
        assert_eq!(Isa::resolve(None, Avx512Vnni), Ok(Avx512Vnni));
        assert_eq!(Isa::resolve(Some(""), Avx2), Ok(Avx2));
        assert_eq!(Isa::resolve(Some("avx2"), Avx512Vnni), Ok(Avx2));
        assert_eq!(Isa::resolve(Some(" scalar "), Avx2), Ok(Scalar));
        assert_eq!(Isa::resolve(Some("avx512"), Avx512Vnni), Ok(Avx512Vnni));
        assert_eq!(Isa::resolve(Some("avx512"), Avx512), Ok(Avx512));
        assert_eq!(
            Isa::resolve(Some("avx512"), Avx2),
            Err(IsaError::Unsupported {
                requested: "avx512",
                detected: "avx2"
            })
        );
        assert_eq!(
            Isa::resolve(Some("sse"), Avx2),
            Err(IsaError::Unknown("sse".into()))
        );
    }

    #[test]
    fn the_active_level_is_one_the_cpu_has() {
        assert!(active() <= Isa::detected());
        assert_eq!(avx2(), active() >= Isa::Avx2);
    }
}
