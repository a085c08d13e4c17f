//! Element-wise and per-row operations of the forward pass, with ggml's numerics where the
//! choice shows in the logits (f64 sum of squares in RMSNorm, RoPE angles by repeated
//! multiplication, tanh-approximated GELU).

use worker_common::model::{Activation, RopePlan, RopeStyle};

/// Defines a function whose body is compiled three times, for AVX-512F, for AVX2 + FMA and
/// for the baseline, and runs the widest the CPU has: element-wise loops then vectorize at
/// that width. The same IEEE operations in the same order at every width (Rust never fuses a
/// multiply and an add on its own), so the same bits.
macro_rules! vectorized {
    ($(#[$doc:meta])* pub fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) {
            #[inline(always)]
            fn body($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512($($arg: $ty),*) {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) {
                    body($($arg),*)
                }
                if crate::isa::avx512() {
                    // SAFETY: the feature was detected on this CPU (crate::isa).
                    return unsafe { avx512($($arg),*) };
                }
                if crate::isa::avx2() {
                    // SAFETY: the features were detected on this CPU (crate::isa).
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

vectorized! {
    /// `out = x / rms(x) * weight` for each `weight.len()`-wide row of `x`, in place. Each
    /// row's sum of squares is summed in f64 in element order (ggml's numerics); four rows'
    /// sums run side by side, as one such chain waits on each addition.
    pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
        let width = weight.len();
        if width == 0 {
            return;
        }
        let mut fours = x.chunks_exact_mut(4 * width);
        for rows in &mut fours {
            let sums = sums_of_squares::<4>(rows, width);
            scale_rows(rows, &sums, weight, eps);
        }
        for row in fours.into_remainder().chunks_exact_mut(width) {
            let sums = sums_of_squares::<1>(row, width);
            scale_rows(row, &sums, weight, eps);
        }
    }
}

/// The f64 sums of squares, in element order, of the `R` rows of `width` in `rows`.
#[inline(always)]
fn sums_of_squares<const R: usize>(rows: &[f32], width: usize) -> [f64; R] {
    let rows: [&[f32]; R] = std::array::from_fn(|r| &rows[r * width..][..width]);
    let mut sums = [0.0f64; R];
    for i in 0..width {
        for (sum, row) in sums.iter_mut().zip(&rows) {
            *sum += f64::from(row[i] * row[i]);
        }
    }
    sums
}

/// Scales each row of `rows` by `1 / sqrt(mean + eps)` (its mean square from `sums`) and by
/// `weight`.
#[inline(always)]
fn scale_rows(rows: &mut [f32], sums: &[f64], weight: &[f32], eps: f32) {
    for (row, &sum) in rows.chunks_exact_mut(weight.len()).zip(sums) {
        let mean = (sum / row.len() as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for (v, w) in row.iter_mut().zip(weight) {
            *v = (*v * scale) * w;
        }
    }
}

/// Adds `bias` to every `bias.len()`-wide row of `x`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

vectorized! {
    /// `x += y`.
    pub fn add_in_place(x: &mut [f32], y: &[f32]) {
        for (a, b) in x.iter_mut().zip(y) {
            *a += b;
        }
    }
}

/// `e^x` within about 2 ulp: Cody–Waite reduction to `x = k·ln 2 + r`, Cephes' degree-6
/// polynomial for `e^r`, and `2^k` built in the exponent bits. Plain IEEE operations with
/// selects instead of branches, so a loop over it vectorises (libm's `expf` is a call per
/// element, which softmaxes and SiLUs pay billions of times). Below −87 it returns `e^−87`
/// (≈ 1.6e-38), which no softmax sum can tell from 0; above 88 it returns +∞ (the true value
/// overflows from 88.72; SiLU, the only caller with such inputs, then gives −0 instead of a
/// value below 1e-36 in magnitude). NaN stays NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const ROUNDER: f32 = 12_582_912.0; // 1.5 · 2^23: adding it rounds to an integer
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Comparisons, not `max`/`min`, which would turn a NaN into a number.
    let overflows = x > 88.0;
    let x = if x < -87.0 { -87.0 } else { x };
    let x = if overflows { 0.0 } else { x };
    let shifted = x * std::f32::consts::LOG2_E + ROUNDER;
    let k = shifted - ROUNDER;
    let r = x - k * LN2_HI - k * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 0.166_666_65;
    let p = p * r + 0.5;
    let e_r = p * (r * r) + r + 1.0;
    // `shifted`'s low mantissa bits hold k in two's complement.
    let k_bits = shifted.to_bits().wrapping_sub(ROUNDER.to_bits()) as i32;
    let two_k = f32::from_bits(((k_bits + 127) as u32) << 23);
    if overflows {
        f32::INFINITY
    } else {
        e_r * two_k
    }
}

/// SiLU, `x · σ(x)`, with [`exp`].
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

vectorized! {
    /// `gate[i] = activation(gate[i]) · up[i]`: the gated FFN's product, in a loop per
    /// activation so that it vectorises.
    pub fn gated(activation: Activation, gate: &mut [f32], up: &[f32]) {
        #[inline(always)]
        fn apply(gate: &mut [f32], up: &[f32], activation: impl Fn(f32) -> f32) {
            for (g, u) in gate.iter_mut().zip(up) {
                *g = activation(*g) * u;
            }
        }
        match activation {
            Activation::Silu => apply(gate, up, silu),
            Activation::GeluTanh => apply(gate, up, gelu_tanh),
            Activation::SwigluOai { alpha, limit } => {
                for (g, u) in gate.iter_mut().zip(up) {
                    *g = swiglu_oai(*g, *u, alpha, limit);
                }
            }
        }
    }
}

/// gpt-oss's clamped SwiGLU of one gate and up value, as ggml's CPU `swiglu_oai` computes it.
pub fn swiglu_oai(gate: f32, up: f32, alpha: f32, limit: f32) -> f32 {
    let x = gate.min(limit);
    let y = up.clamp(-limit, limit);
    let glu = x / (1.0 + exp(alpha * -x));
    glu * (y + 1.0)
}

/// GELU with the tanh approximation, evaluated as llama.cpp's CPU backend does: 0 below −10,
/// identity above 10, and in between on the input rounded to f16 with the result rounded to
/// f16 (ggml's `GGML_GELU_FP16` lookup table, which gemma's logits carry).
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044_715;
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    let x = half::f16::from_f32(x).to_f32();
    let y = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh());
    half::f16::from_f32(y).to_f32()
}

/// `(cos, sin)` for each of the `rope.dims / 2` pairs at `pos`, pair `i`'s angle divided by
/// `factors[i]` when the model has frequency factors, blended by YaRN's ramp when it has one,
/// both scaled by `rope.attn_factor` (ggml's `rope_yarn`: the same operations in the same
/// order).
pub fn rope_angles(
    rope: &RopePlan,
    factors: Option<&[f32]>,
    pos: usize,
    out: &mut Vec<(f32, f32)>,
) {
    out.clear();
    let mut theta = pos as f32;
    for i in 0..rope.dims / 2 {
        let extrapolated = factors.map_or(theta, |f| theta / f[i]);
        let interpolated = rope.freq_scale * extrapolated;
        let angle = match rope.yarn {
            Some(ramp) => {
                let mix = ramp.mix(i);
                interpolated * (1.0 - mix) + extrapolated * mix
            }
            None => interpolated,
        };
        let (sin, cos) = angle.sin_cos();
        out.push((cos * rope.attn_factor, sin * rope.attn_factor));
        theta *= rope.theta_scale;
    }
}

/// Rotates one head in place with the angles of its position.
pub fn rope_apply(rope: &RopePlan, head: &mut [f32], angles: &[(f32, f32)]) {
    let half = rope.dims / 2;
    for (i, &(cos, sin)) in angles.iter().enumerate() {
        let (a, b) = match rope.style {
            RopeStyle::Normal => (2 * i, 2 * i + 1),
            RopeStyle::Neox => (i, i + half),
        };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * cos - x1 * sin;
        head[b] = x0 * sin + x1 * cos;
    }
}

/// `cap · tanh(x / cap)` on every logit.
pub fn softcap(logits: &mut [f32], cap: f32) {
    for v in logits {
        *v = (*v / cap).tanh() * cap;
    }
}

/// Asks the CPU to bring `data` into the caches (a hint: no effect on results, none off x86).
pub fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        const LINE: usize = 64;
        let bytes = std::mem::size_of_val(data);
        let start = data.as_ptr().cast::<i8>();
        for offset in (0..bytes).step_by(LINE) {
            // SAFETY: a prefetch never faults; the address lies inside `data` anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(offset)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_a_few_ulp_of_libm() {
        let mut worst = 0.0f64;
        let steps = (-87_000..88_000).step_by(7).map(|i| i as f32 / 1000.0);
        for x in steps.chain([0.0, -1e-30, 1e-30, -0.5, -87.0, -86.9, 87.9, 88.0]) {
            let want = f64::from(x).exp();
            worst = worst.max((f64::from(exp(x)) - want).abs() / want);
        }
        assert!(worst < 4e-7, "relative error {worst:e}");
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(-1000.0), exp(-87.0));
        assert_eq!(exp(88.5), f32::INFINITY);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(silu(-1000.0), -0.0);
        assert!(silu(f32::NAN).is_nan());
    }

    #[test]
    fn rms_norm_unit_rows() {
        let mut x = vec![3.0, 4.0, 0.0, 0.0, -2.0, 2.0];
        rms_norm(&mut x, &[1.0, 1.0], 1e-6);
        let rms0 = (12.5f32).sqrt();
        assert!((x[0] - 3.0 / rms0).abs() < 1e-5 && (x[1] - 4.0 / rms0).abs() < 1e-5);
        assert_eq!(&x[2..4], &[0.0, 0.0][..]);
        assert!((x[4] + 1.0).abs() < 1e-5 && (x[5] - 1.0).abs() < 1e-5);
    }

    #[test]
    fn rope_position_zero_is_identity_and_preserves_norm() {
        for style in [RopeStyle::Normal, RopeStyle::Neox] {
            let rope = rope_plan(style, 8);
            let head: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
            let mut angles = Vec::new();
            rope_angles(&rope, None, 0, &mut angles);
            let mut rotated = head.clone();
            rope_apply(&rope, &mut rotated, &angles);
            assert_eq!(rotated, head);
            rope_angles(&rope, None, 17, &mut angles);
            rope_apply(&rope, &mut rotated, &angles);
            let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>();
            assert!((norm(&rotated) - norm(&head)).abs() < 1e-3);
            assert_ne!(rotated, head);
        }
    }

    fn rope_plan(style: RopeStyle, dims: usize) -> RopePlan {
        RopePlan {
            style,
            dims,
            theta_scale: 10_000f32.powf(-2.0 / dims as f32),
            freq_scale: 1.0,
            attn_factor: 1.0,
            yarn: None,
        }
    }

    #[test]
    fn rope_factors_divide_each_pair_and_attn_factor_scales() {
        let rope = RopePlan {
            attn_factor: 2.0,
            ..rope_plan(RopeStyle::Normal, 4)
        };
        let (mut plain, mut scaled) = (Vec::new(), Vec::new());
        rope_angles(&rope_plan(RopeStyle::Normal, 4), None, 3, &mut plain);
        rope_angles(&rope, Some(&[1.0, 4.0]), 3, &mut scaled);
        assert_eq!(scaled[0], (2.0 * plain[0].0, 2.0 * plain[0].1));
        let theta = 3.0 * rope.theta_scale / 4.0;
        assert_eq!(scaled[1], (2.0 * theta.cos(), 2.0 * theta.sin()));
    }

    #[test]
    fn rope_pairs_by_style() {
        let mut angles = Vec::new();
        let normal = rope_plan(RopeStyle::Normal, 4);
        rope_angles(&normal, None, 1, &mut angles);
        // Pair 0 rotates by one radian: elements (0, 1) for Normal, (0, 2) for NEOX.
        let mut head = [1.0, 0.0, 0.0, 0.0];
        rope_apply(&normal, &mut head, &angles);
        assert!((head[1] - 1f32.sin()).abs() < 1e-6 && head[2] == 0.0);
        let neox = rope_plan(RopeStyle::Neox, 4);
        let mut head = [1.0, 0.0, 0.0, 0.0];
        rope_apply(&neox, &mut head, &angles);
        assert!((head[2] - 1f32.sin()).abs() < 1e-6 && head[1] == 0.0);
    }

    #[test]
    fn activations_match_known_values() {
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-3);
        assert_eq!(gelu_tanh(-11.0), 0.0);
        assert_eq!(gelu_tanh(12.5), 12.5);
        assert_eq!(gelu_tanh(0.0), 0.0);
    }
}
