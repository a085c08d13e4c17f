//! Metadata values: the 13 GGUF value types, parsed and validated once, read without copying.

use std::fmt;

use super::GgufError;
use super::cursor::{Cursor, Span};
use super::error::excerpt;

/// How deeply arrays may nest; real files use at most 2, and a limit keeps hostile files from
/// exhausting the stack.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// The type tag of a metadata value (`enum gguf_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// `GGUF_TYPE_UINT8`
    U8,
    /// `GGUF_TYPE_INT8`
    I8,
    /// `GGUF_TYPE_UINT16`
    U16,
    /// `GGUF_TYPE_INT16`
    I16,
    /// `GGUF_TYPE_UINT32`
    U32,
    /// `GGUF_TYPE_INT32`
    I32,
    /// `GGUF_TYPE_FLOAT32`
    F32,
    /// `GGUF_TYPE_BOOL`
    Bool,
    /// `GGUF_TYPE_STRING`
    String,
    /// `GGUF_TYPE_ARRAY`
    Array,
    /// `GGUF_TYPE_UINT64`
    U64,
    /// `GGUF_TYPE_INT64`
    I64,
    /// `GGUF_TYPE_FLOAT64`
    F64,
}

impl ValueType {
    /// The type with this on-disk id.
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Encoded size of one value, for fixed-size types.
    pub fn fixed_size(self) -> Option<u64> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// Smallest encoding of one value: a fixed size, a string's length field, an array's header.
    fn min_size(self) -> u64 {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            fixed => fixed.fixed_size().unwrap_or(1),
        }
    }

    /// The lower-case name used in messages (`u32`, `string`, …).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// A metadata value borrowed from the file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    /// An unsigned 8-bit integer.
    U8(u8),
    /// A signed 8-bit integer.
    I8(i8),
    /// An unsigned 16-bit integer.
    U16(u16),
    /// A signed 16-bit integer.
    I16(i16),
    /// An unsigned 32-bit integer.
    U32(u32),
    /// A signed 32-bit integer.
    I32(i32),
    /// A 32-bit float.
    F32(f32),
    /// A boolean (any non-zero byte is true).
    Bool(bool),
    /// String bytes as stored; GGUF says UTF-8 but files do not always comply.
    String(&'a [u8]),
    /// An array, decoded lazily.
    Array(ArrayValue<'a>),
    /// An unsigned 64-bit integer.
    U64(u64),
    /// A signed 64-bit integer.
    I64(i64),
    /// A 64-bit float.
    F64(f64),
}

impl Value<'_> {
    /// The value's type tag.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The value as a signed 128-bit integer, for any integer type.
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// A description for error messages: the type, and the element type for arrays.
    pub fn type_description(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {} {}", a.len(), a.element_type().name()),
            other => other.value_type().name().to_owned(),
        }
    }
}

impl fmt::Display for Value<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) => write!(f, "{:?}", String::from_utf8_lossy(s)),
            Value::Array(a) => write!(f, "[{} × {}]", a.len(), a.element_type().name()),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
        }
    }
}

/// An array value: its element type, length and encoded elements, decoded on iteration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ArrayValue<'a> {
    element_type: ValueType,
    len: u64,
    elements: &'a [u8],
}

impl<'a> ArrayValue<'a> {
    /// The type of every element.
    pub fn element_type(&self) -> ValueType {
        self.element_type
    }

    /// Number of elements.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The encoded elements (little-endian, as stored), e.g. for bulk reads of numbers.
    pub fn raw_bytes(&self) -> &'a [u8] {
        self.elements
    }

    /// The elements in order.
    pub fn iter(&self) -> ArrayIter<'a> {
        ArrayIter {
            element_type: self.element_type,
            left: self.len,
            cursor: Cursor::new(self.elements),
        }
    }
}

/// Iterator over an [`ArrayValue`].
pub struct ArrayIter<'a> {
    element_type: ValueType,
    left: u64,
    cursor: Cursor<'a>,
}

impl<'a> Iterator for ArrayIter<'a> {
    type Item = Value<'a>;

    fn next(&mut self) -> Option<Value<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // The array was validated when the file was parsed, so decoding cannot fail; if it did,
        // ending the iteration is the safe answer.
        let bytes = self.cursor_bytes();
        let raw = read_value(&mut self.cursor, self.element_type, "", MAX_ARRAY_DEPTH).ok()?;
        Some(raw.resolve(bytes))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = usize::try_from(self.left).unwrap_or(usize::MAX);
        (left, Some(left))
    }
}

impl<'a> ArrayIter<'a> {
    fn cursor_bytes(&self) -> &'a [u8] {
        self.cursor.bytes()
    }
}

/// A parsed value that refers to file bytes by position, so it can be stored beside the mapping.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum RawValue {
    Scalar(Value<'static>),
    String(Span),
    Array {
        element_type: ValueType,
        len: u64,
        elements: Span,
    },
}

impl RawValue {
    pub fn resolve(self, bytes: &[u8]) -> Value<'_> {
        match self {
            RawValue::Scalar(v) => v,
            RawValue::String(span) => Value::String(span.of(bytes)),
            RawValue::Array {
                element_type,
                len,
                elements,
            } => Value::Array(ArrayValue {
                element_type,
                len,
                elements: elements.of(bytes),
            }),
        }
    }
}

/// Reads one value of type `ty`, validating nested arrays down to `depth_left` levels.
pub(crate) fn read_value(
    cursor: &mut Cursor<'_>,
    ty: ValueType,
    key: &str,
    depth_left: usize,
) -> Result<RawValue, GgufError> {
    let what = || format!("value of metadata key {:?}", excerpt(key));
    Ok(RawValue::Scalar(match ty {
        ValueType::U8 => Value::U8(cursor.u8(what)?),
        ValueType::I8 => Value::I8(cursor.u8(what)? as i8),
        ValueType::U16 => Value::U16(cursor.u16(what)?),
        ValueType::I16 => Value::I16(cursor.u16(what)? as i16),
        ValueType::U32 => Value::U32(cursor.u32(what)?),
        ValueType::I32 => Value::I32(cursor.u32(what)? as i32),
        ValueType::F32 => Value::F32(f32::from_bits(cursor.u32(what)?)),
        ValueType::Bool => Value::Bool(cursor.u8(what)? != 0),
        ValueType::U64 => Value::U64(cursor.u64(what)?),
        ValueType::I64 => Value::I64(cursor.u64(what)? as i64),
        ValueType::F64 => Value::F64(f64::from_bits(cursor.u64(what)?)),
        ValueType::String => return Ok(RawValue::String(cursor.string(what)?)),
        ValueType::Array => return read_array(cursor, key, depth_left),
    }))
}

fn read_array(
    cursor: &mut Cursor<'_>,
    key: &str,
    depth_left: usize,
) -> Result<RawValue, GgufError> {
    if depth_left == 0 {
        return Err(GgufError::NestingTooDeep {
            key: excerpt(key),
            max: MAX_ARRAY_DEPTH,
        });
    }
    let type_id =
        cursor.u32(|| format!("array element type of metadata key {:?}", excerpt(key)))?;
    let element_type = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
        key: excerpt(key),
        type_id,
    })?;
    let len = cursor.count(
        || format!("elements in array {:?}", excerpt(key)),
        element_type.min_size(),
    )?;
    let start = cursor.pos();
    match element_type.fixed_size() {
        // `count` checked len × size fits in what remains.
        Some(size) => {
            cursor.take(len * size, || {
                format!("elements of array {:?}", excerpt(key))
            })?;
        }
        None => {
            for _ in 0..len {
                read_value(cursor, element_type, key, depth_left - 1)?;
            }
        }
    }
    let elements = Span {
        start,
        len: cursor.pos() - start,
    };
    Ok(RawValue::Array {
        element_type,
        len,
        elements,
    })
}
