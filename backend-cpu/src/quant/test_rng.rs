//! The deterministic test-data generator the quant tests share (xorshift64*), so failures
//! reproduce without a dependency.

/// xorshift64* state.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// The next 64 random bits.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A uniform index below `n`.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A random byte.
    pub(crate) fn byte(&mut self) -> u8 {
        (self.next() >> 56) as u8
    }

    /// Uniform in `[-1, 1)`.
    pub(crate) fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }
}
