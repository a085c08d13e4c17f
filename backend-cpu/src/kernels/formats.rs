//! The weight formats as types: a SIMD body generic over one of these is compiled once per
//! format with no format branch inside (const generics cannot take the [`Legacy`] and
//! [`KQuant`] enums themselves).

use super::Legacy;
use super::rows::KQuant;

/// A 32-element block format as a type.
pub trait LegacyType: Copy + Send + Sync + 'static {
    /// The format.
    const FORMAT: Legacy;
}

/// A k-quant format as a type.
pub trait KType: Copy + Send + Sync + 'static {
    /// The format.
    const FORMAT: KQuant;
}

/// Defines the marker types of one trait.
macro_rules! markers {
    ($trait:ident, $enum:ident: $($name:ident => $variant:ident),*) => {
        $(
            #[doc = concat!("The ", stringify!($variant), " format.")]
            #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
            pub struct $name;

            impl $trait for $name {
                const FORMAT: $enum = $enum::$variant;
            }
        )*
    };
}

markers!(
    LegacyType,
    Legacy: Q4_0 => Q4_0, Q4_1 => Q4_1, Q5_0 => Q5_0, Q5_1 => Q5_1, Q8_0 => Q8_0, Iq4Nl => Iq4Nl
);
markers!(KType, KQuant: Q2K => Q2K, Q3K => Q3K, Q4K => Q4K, Q5K => Q5K, Q6K => Q6K, Iq4Xs => Iq4Xs,
    Iq3S => Iq3S, Iq3Xxs => Iq3Xxs);
