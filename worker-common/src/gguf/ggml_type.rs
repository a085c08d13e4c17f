//! ggml tensor types as llama.cpp b11434 numbers them, with their block geometry.

use std::fmt;

/// Declares the type enum and its table once, so ids, names and sizes cannot drift apart.
macro_rules! ggml_types {
    ($($variant:ident = $id:literal, $name:literal, $block:literal, $bytes:literal;)*) => {
        /// A ggml tensor element type (`enum ggml_type` of llama.cpp b11434).
        ///
        /// Ids 4, 5 and 31..=33, 36..=38 were removed from GGUF files upstream and are unknown here.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(non_camel_case_types)]
        pub enum GgmlType {
            $(
                #[doc = concat!("`GGML_TYPE_", $name, "`: ", $block, " elements in ", $bytes, " bytes.")]
                $variant = $id,
            )*
        }

        impl GgmlType {
            /// Every known type, in id order.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$variant),*];

            /// The type with this on-disk id, if llama.cpp b11434 knows it.
            pub fn from_id(id: u32) -> Option<Self> {
                match id {
                    $($id => Some(GgmlType::$variant),)*
                    _ => None,
                }
            }

            /// The upstream name, e.g. `Q4_K`.
            pub fn name(self) -> &'static str {
                match self {
                    $(GgmlType::$variant => $name,)*
                }
            }

            /// Elements per block (1 for plain element types).
            pub fn block_size(self) -> u64 {
                match self {
                    $(GgmlType::$variant => $block,)*
                }
            }

            /// Bytes per block.
            pub fn block_bytes(self) -> u64 {
                match self {
                    $(GgmlType::$variant => $bytes,)*
                }
            }
        }
    };
}

ggml_types! {
    F32 = 0, "F32", 1, 4;
    F16 = 1, "F16", 1, 2;
    Q4_0 = 2, "Q4_0", 32, 18;
    Q4_1 = 3, "Q4_1", 32, 20;
    Q5_0 = 6, "Q5_0", 32, 22;
    Q5_1 = 7, "Q5_1", 32, 24;
    Q8_0 = 8, "Q8_0", 32, 34;
    Q8_1 = 9, "Q8_1", 32, 36;
    Q2_K = 10, "Q2_K", 256, 84;
    Q3_K = 11, "Q3_K", 256, 110;
    Q4_K = 12, "Q4_K", 256, 144;
    Q5_K = 13, "Q5_K", 256, 176;
    Q6_K = 14, "Q6_K", 256, 210;
    Q8_K = 15, "Q8_K", 256, 292;
    IQ2_XXS = 16, "IQ2_XXS", 256, 66;
    IQ2_XS = 17, "IQ2_XS", 256, 74;
    IQ3_XXS = 18, "IQ3_XXS", 256, 98;
    IQ1_S = 19, "IQ1_S", 256, 50;
    IQ4_NL = 20, "IQ4_NL", 32, 18;
    IQ3_S = 21, "IQ3_S", 256, 110;
    IQ2_S = 22, "IQ2_S", 256, 82;
    IQ4_XS = 23, "IQ4_XS", 256, 136;
    I8 = 24, "I8", 1, 1;
    I16 = 25, "I16", 1, 2;
    I32 = 26, "I32", 1, 4;
    I64 = 27, "I64", 1, 8;
    F64 = 28, "F64", 1, 8;
    IQ1_M = 29, "IQ1_M", 256, 56;
    BF16 = 30, "BF16", 1, 2;
    TQ1_0 = 34, "TQ1_0", 256, 54;
    TQ2_0 = 35, "TQ2_0", 256, 66;
    MXFP4 = 39, "MXFP4", 32, 17;
    NVFP4 = 40, "NVFP4", 64, 36;
    Q1_0 = 41, "Q1_0", 128, 18;
    Q2_0 = 42, "Q2_0", 64, 18;
}

impl GgmlType {
    /// The on-disk id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Bytes taken by `elements` elements, or `None` if `elements` is not a whole number of
    /// blocks or the size overflows.
    pub fn bytes_for(self, elements: u64) -> Option<u64> {
        if !elements.is_multiple_of(self.block_size()) {
            return None;
        }
        (elements / self.block_size()).checked_mul(self.block_bytes())
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The label llama.cpp prints for `general.file_type` (`enum llama_ftype`), e.g. 15 → `Q4_K_M`.
pub fn file_type_label(file_type: u32) -> Option<&'static str> {
    Some(match file_type {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        39 => "NVFP4",
        40 => "Q1_0",
        41 => "Q2_0",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_removed_ids_are_unknown() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 43, u32::MAX] {
            assert_eq!(GgmlType::from_id(removed), None, "id {removed}");
        }
        assert_eq!(GgmlType::ALL.len(), 35);
    }

    #[test]
    fn block_geometry_matches_ggml_common_h() {
        // Spot checks against the static_asserts of ggml-common.h (b11434).
        assert_eq!(
            (GgmlType::Q4_K.block_size(), GgmlType::Q4_K.block_bytes()),
            (256, 144)
        );
        assert_eq!(
            (GgmlType::Q6_K.block_size(), GgmlType::Q6_K.block_bytes()),
            (256, 210)
        );
        assert_eq!(
            (GgmlType::Q5_0.block_size(), GgmlType::Q5_0.block_bytes()),
            (32, 22)
        );
        assert_eq!(
            (GgmlType::TQ1_0.block_size(), GgmlType::TQ1_0.block_bytes()),
            (256, 54)
        );
        // block_iq4_nl: d, qs[QK4_NL/2].
        assert_eq!(
            (
                GgmlType::IQ4_NL.block_size(),
                GgmlType::IQ4_NL.block_bytes()
            ),
            (32, 2 + 16)
        );
        // block_iq4_xs: d, scales_h, scales_l[QK_K/64], qs[QK_K/2].
        assert_eq!(
            (
                GgmlType::IQ4_XS.block_size(),
                GgmlType::IQ4_XS.block_bytes()
            ),
            (256, 2 + 2 + 4 + 128)
        );
        // block_iq3_s: d, qs[QK_K/4], qh[QK_K/32], signs[QK_K/8], scales[QK_K/64].
        assert_eq!(
            (GgmlType::IQ3_S.block_size(), GgmlType::IQ3_S.block_bytes()),
            (256, 2 + 64 + 8 + 32 + 4)
        );
        // block_iq3_xxs: d, qs[3*QK_K/8] (64 grid index bytes, 32 of scales and signs).
        assert_eq!(
            (
                GgmlType::IQ3_XXS.block_size(),
                GgmlType::IQ3_XXS.block_bytes()
            ),
            (256, 2 + 64 + 32)
        );
        assert_eq!(GgmlType::Q8_0.bytes_for(64), Some(68));
        assert_eq!(GgmlType::Q8_0.bytes_for(33), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
    }

    #[test]
    fn file_type_labels() {
        assert_eq!(file_type_label(15), Some("Q4_K_M"));
        assert_eq!(file_type_label(3), Some("Q4_1"));
        assert_eq!(file_type_label(4), None);
    }
}
