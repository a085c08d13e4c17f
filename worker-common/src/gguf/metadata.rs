//! Typed metadata lookups whose errors name the key, the expected type and the type found.

use super::{ArrayValue, Gguf, GgufError, Value};

/// A Rust type a metadata value can be read as.
pub trait FromValue<'a>: Sized {
    /// The type named in errors.
    const EXPECTED: &'static str;

    /// Converts `value`, stored under `key`; `None` means the value has another type.
    fn from_value(key: &str, value: Value<'a>) -> Result<Option<Self>, GgufError>;
}

/// Integers convert from any integer type whose value fits, as llama.cpp's loader allows.
macro_rules! integer_from_value {
    ($($t:ty),*) => {$(
        impl FromValue<'_> for $t {
            const EXPECTED: &'static str = stringify!($t);

            fn from_value(key: &str, value: Value<'_>) -> Result<Option<Self>, GgufError> {
                let Some(wide) = value.as_integer() else { return Ok(None) };
                <$t>::try_from(wide).map(Some).map_err(|_| GgufError::OutOfRange {
                    key: key.to_owned(),
                    value: wide.to_string(),
                    target: Self::EXPECTED,
                })
            }
        }
    )*};
}

integer_from_value!(u32, u64, i32, i64, usize);

impl FromValue<'_> for f32 {
    const EXPECTED: &'static str = "f32";

    fn from_value(_key: &str, value: Value<'_>) -> Result<Option<Self>, GgufError> {
        Ok(match value {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        })
    }
}

impl FromValue<'_> for bool {
    const EXPECTED: &'static str = "bool";

    fn from_value(_key: &str, value: Value<'_>) -> Result<Option<Self>, GgufError> {
        Ok(match value {
            Value::Bool(v) => Some(v),
            _ => None,
        })
    }
}

impl<'a> FromValue<'a> for &'a str {
    const EXPECTED: &'static str = "string";

    fn from_value(key: &str, value: Value<'a>) -> Result<Option<Self>, GgufError> {
        let Value::String(bytes) = value else {
            return Ok(None);
        };
        std::str::from_utf8(bytes)
            .map(Some)
            .map_err(|_| GgufError::InvalidUtf8 {
                what: format!("value of metadata key {key:?}"),
                offset: 0,
            })
    }
}

impl<'a> FromValue<'a> for ArrayValue<'a> {
    const EXPECTED: &'static str = "array";

    fn from_value(_key: &str, value: Value<'a>) -> Result<Option<Self>, GgufError> {
        Ok(match value {
            Value::Array(array) => Some(array),
            _ => None,
        })
    }
}

impl<B: AsRef<[u8]>> Gguf<B> {
    /// The value of `key` as `T`; missing keys and other types are errors naming the key.
    pub fn require<'a, T: FromValue<'a>>(&'a self, key: &str) -> Result<T, GgufError> {
        self.optional(key)?.ok_or_else(|| GgufError::MissingKey {
            key: key.to_owned(),
        })
    }

    /// The value of `key` as `T`, or `None` when absent; another type is still an error.
    pub fn optional<'a, T: FromValue<'a>>(&'a self, key: &str) -> Result<Option<T>, GgufError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        match T::from_value(key, value)? {
            Some(converted) => Ok(Some(converted)),
            None => Err(GgufError::WrongType {
                key: key.to_owned(),
                expected: T::EXPECTED,
                found: value.type_description(),
            }),
        }
    }
}
