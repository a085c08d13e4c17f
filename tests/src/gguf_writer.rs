//! A GGUF v3 writer for tests: build a file from owned values, or copy a parsed one and change it.
//!
//! The writer lays files out the way llama.cpp's `gguf_write` does: header, metadata, tensor
//! infos, zero padding to the alignment, then each tensor's data padded to the alignment. It does
//! not validate what it is given, so tests can write files the reader must refuse (a tensor whose
//! shape does not match its data, an alignment that is not a power of two).

use std::borrow::Cow;

use worker_common::gguf::{
    ALIGNMENT_KEY, ArrayValue, DEFAULT_ALIGNMENT, GGUF_VERSION, GgmlType, Gguf, Value, ValueType,
};

/// An owned metadata value: one of the 13 GGUF value types, arrays nested to any depth.
#[derive(Debug, Clone, PartialEq)]
pub enum OwnedValue {
    /// `GGUF_TYPE_UINT8`
    U8(u8),
    /// `GGUF_TYPE_INT8`
    I8(i8),
    /// `GGUF_TYPE_UINT16`
    U16(u16),
    /// `GGUF_TYPE_INT16`
    I16(i16),
    /// `GGUF_TYPE_UINT32`
    U32(u32),
    /// `GGUF_TYPE_INT32`
    I32(i32),
    /// `GGUF_TYPE_FLOAT32`
    F32(f32),
    /// `GGUF_TYPE_BOOL`, written as one byte 0 or 1.
    Bool(bool),
    /// `GGUF_TYPE_STRING`: raw bytes, so tests can also write strings that are not UTF-8.
    String(Vec<u8>),
    /// `GGUF_TYPE_ARRAY`
    Array(OwnedArray),
    /// `GGUF_TYPE_UINT64`
    U64(u64),
    /// `GGUF_TYPE_INT64`
    I64(i64),
    /// `GGUF_TYPE_FLOAT64`
    F64(f64),
}

/// An owned array: an element type and elements that all have it.
///
/// The element type is stored rather than derived so that empty arrays keep theirs.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedArray {
    element_type: ValueType,
    elements: Vec<OwnedValue>,
}

impl OwnedArray {
    /// An array of `elements`, or `None` when one of them is not of `element_type`.
    pub fn new(element_type: ValueType, elements: Vec<OwnedValue>) -> Option<Self> {
        elements
            .iter()
            .all(|e| e.value_type() == element_type)
            .then_some(Self {
                element_type,
                elements,
            })
    }

    /// The type of every element.
    pub fn element_type(&self) -> ValueType {
        self.element_type
    }

    /// The elements in order.
    pub fn elements(&self) -> &[OwnedValue] {
        &self.elements
    }
}

impl OwnedValue {
    /// A string value.
    pub fn string(s: &str) -> Self {
        Self::String(s.as_bytes().to_vec())
    }

    /// An array of strings.
    pub fn strings<'s>(items: impl IntoIterator<Item = &'s str>) -> Self {
        Self::Array(OwnedArray {
            element_type: ValueType::String,
            elements: items.into_iter().map(Self::string).collect(),
        })
    }

    /// An array of `elements`, or `None` when one of them is not of `element_type`.
    pub fn array(element_type: ValueType, elements: Vec<OwnedValue>) -> Option<Self> {
        OwnedArray::new(element_type, elements).map(Self::Array)
    }

    /// The value's type tag.
    pub fn value_type(&self) -> ValueType {
        match self {
            Self::U8(_) => ValueType::U8,
            Self::I8(_) => ValueType::I8,
            Self::U16(_) => ValueType::U16,
            Self::I16(_) => ValueType::I16,
            Self::U32(_) => ValueType::U32,
            Self::I32(_) => ValueType::I32,
            Self::F32(_) => ValueType::F32,
            Self::Bool(_) => ValueType::Bool,
            Self::String(_) => ValueType::String,
            Self::Array(_) => ValueType::Array,
            Self::U64(_) => ValueType::U64,
            Self::I64(_) => ValueType::I64,
            Self::F64(_) => ValueType::F64,
        }
    }

    /// The value as an unsigned integer, for any integer type holding a non-negative value.
    fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Appends the value's encoding, without its type tag, to `out`.
    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Self::U8(v) => out.push(*v),
            Self::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::Bool(v) => out.push(u8::from(*v)),
            Self::String(bytes) => write_string(out, bytes),
            Self::Array(array) => {
                write_u32(out, value_type_id(array.element_type));
                write_u64(out, array.elements.len() as u64);
                for element in &array.elements {
                    element.write(out);
                }
            }
            Self::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
}

impl From<Value<'_>> for OwnedValue {
    fn from(value: Value<'_>) -> Self {
        match value {
            Value::U8(v) => Self::U8(v),
            Value::I8(v) => Self::I8(v),
            Value::U16(v) => Self::U16(v),
            Value::I16(v) => Self::I16(v),
            Value::U32(v) => Self::U32(v),
            Value::I32(v) => Self::I32(v),
            Value::F32(v) => Self::F32(v),
            Value::Bool(v) => Self::Bool(v),
            Value::String(bytes) => Self::String(bytes.to_vec()),
            Value::Array(array) => Self::Array(OwnedArray::from(array)),
            Value::U64(v) => Self::U64(v),
            Value::I64(v) => Self::I64(v),
            Value::F64(v) => Self::F64(v),
        }
    }
}

impl From<ArrayValue<'_>> for OwnedArray {
    fn from(array: ArrayValue<'_>) -> Self {
        Self {
            element_type: array.element_type(),
            elements: array.iter().map(OwnedValue::from).collect(),
        }
    }
}

/// The on-disk id of a value type (`enum gguf_type`).
pub fn value_type_id(value_type: ValueType) -> u32 {
    match value_type {
        ValueType::U8 => 0,
        ValueType::I8 => 1,
        ValueType::U16 => 2,
        ValueType::I16 => 3,
        ValueType::U32 => 4,
        ValueType::I32 => 5,
        ValueType::F32 => 6,
        ValueType::Bool => 7,
        ValueType::String => 8,
        ValueType::Array => 9,
        ValueType::U64 => 10,
        ValueType::I64 => 11,
        ValueType::F64 => 12,
    }
}

/// One tensor to write: its info and its bytes, borrowed from a parsed file or owned.
#[derive(Debug, Clone)]
struct TensorEntry<'a> {
    name: String,
    ggml_type: GgmlType,
    shape: Vec<u64>,
    data: Cow<'a, [u8]>,
}

/// Builds a GGUF v3 file: metadata entries and tensors, each kept in insertion order.
#[derive(Debug, Clone, Default)]
pub struct GgufBuilder<'a> {
    metadata: Vec<(String, OwnedValue)>,
    tensors: Vec<TensorEntry<'a>>,
}

impl<'a> GgufBuilder<'a> {
    /// An empty file: no metadata, no tensors.
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder holding every metadata entry and every tensor of `gguf`, in file order.
    ///
    /// Tensor data is borrowed from `gguf`, so copying a model costs nothing until `to_bytes`.
    pub fn from_gguf<B: AsRef<[u8]>>(gguf: &'a Gguf<B>) -> Self {
        let metadata = gguf
            .metadata()
            .map(|(key, value)| (key.to_owned(), OwnedValue::from(value)))
            .collect();
        let tensors = gguf
            .tensors()
            .map(|t| TensorEntry {
                name: t.name.to_owned(),
                ggml_type: t.ggml_type,
                shape: t.shape.to_vec(),
                data: Cow::Borrowed(t.data),
            })
            .collect();
        Self { metadata, tensors }
    }

    /// Sets `key` to `value`: replaced in place when present, appended otherwise.
    pub fn metadata(&mut self, key: &str, value: OwnedValue) -> &mut Self {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some((_, slot)) => *slot = value,
            None => self.metadata.push((key.to_owned(), value)),
        }
        self
    }

    /// Removes `key`, returning its value if it was present.
    pub fn remove_metadata(&mut self, key: &str) -> Option<OwnedValue> {
        let index = self.metadata.iter().position(|(k, _)| k == key)?;
        Some(self.metadata.remove(index).1)
    }

    /// Sets `general.alignment` (a u32), which also sets the padding `to_bytes` uses when it is a
    /// power of two.
    pub fn alignment(&mut self, alignment: u32) -> &mut Self {
        self.metadata(ALIGNMENT_KEY, OwnedValue::U32(alignment))
    }

    /// Adds tensor `name`, or replaces the tensor of that name in place.
    ///
    /// `data` is written as given: it is not checked against the type and shape.
    pub fn tensor(
        &mut self,
        name: &str,
        ggml_type: GgmlType,
        shape: &[u64],
        data: impl Into<Cow<'a, [u8]>>,
    ) -> &mut Self {
        let entry = TensorEntry {
            name: name.to_owned(),
            ggml_type,
            shape: shape.to_vec(),
            data: data.into(),
        };
        match self.tensors.iter_mut().find(|t| t.name == name) {
            Some(slot) => *slot = entry,
            None => self.tensors.push(entry),
        }
        self
    }

    /// Removes tensor `name`; returns whether it was present.
    pub fn remove_tensor(&mut self, name: &str) -> bool {
        let before = self.tensors.len();
        self.tensors.retain(|t| t.name != name);
        self.tensors.len() != before
    }

    /// Gives tensor `name` a new shape, keeping its data; returns whether it was present.
    pub fn set_tensor_shape(&mut self, name: &str, shape: &[u64]) -> bool {
        let Some(tensor) = self.tensors.iter_mut().find(|t| t.name == name) else {
            return false;
        };
        tensor.shape = shape.to_vec();
        true
    }

    /// The padding unit of the data section: `general.alignment` when it holds a power of two
    /// that fits a u32 (as the reader accepts it), else the default. A file with an invalid
    /// value is still written, with the default padding, for the reader to refuse.
    pub fn layout_alignment(&self) -> u64 {
        self.metadata
            .iter()
            .find(|(k, _)| k == ALIGNMENT_KEY)
            .and_then(|(_, v)| v.as_u64())
            .filter(|a| a.is_power_of_two() && *a <= u64::from(u32::MAX))
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let alignment = self.layout_alignment();
        let offsets = self.data_offsets(alignment);
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        write_u32(&mut out, GGUF_VERSION);
        write_u64(&mut out, self.tensors.len() as u64);
        write_u64(&mut out, self.metadata.len() as u64);
        for (key, value) in &self.metadata {
            write_string(&mut out, key.as_bytes());
            write_u32(&mut out, value_type_id(value.value_type()));
            value.write(&mut out);
        }
        for (tensor, &offset) in self.tensors.iter().zip(&offsets) {
            write_tensor_info(&mut out, tensor, offset);
        }
        pad(&mut out, alignment);
        for tensor in &self.tensors {
            out.extend_from_slice(&tensor.data);
            pad(&mut out, alignment);
        }
        out
    }

    /// Offsets of the tensors inside the data section: packed in order, each padded.
    fn data_offsets(&self, alignment: u64) -> Vec<u64> {
        let mut next = 0u64;
        self.tensors
            .iter()
            .map(|t| {
                let offset = next;
                next = (offset + t.data.len() as u64).next_multiple_of(alignment);
                offset
            })
            .collect()
    }
}

fn write_tensor_info(out: &mut Vec<u8>, tensor: &TensorEntry<'_>, offset: u64) {
    write_string(out, tensor.name.as_bytes());
    write_u32(out, tensor.shape.len() as u32);
    for &dim in &tensor.shape {
        write_u64(out, dim);
    }
    write_u32(out, tensor.ggml_type.id());
    write_u64(out, offset);
}

fn write_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn write_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn write_string(out: &mut Vec<u8>, bytes: &[u8]) {
    write_u64(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Zero-pads `out` to a multiple of `alignment`.
fn pad(out: &mut Vec<u8>, alignment: u64) {
    let len = out.len() as u64;
    let padded = len.next_multiple_of(alignment);
    out.resize(out.len() + (padded - len) as usize, 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assets::Model;

    /// `(key, value)` of every metadata entry, in file order.
    fn metadata_of<B: AsRef<[u8]>>(gguf: &Gguf<B>) -> Vec<(String, OwnedValue)> {
        gguf.metadata()
            .map(|(k, v)| (k.to_owned(), OwnedValue::from(v)))
            .collect()
    }

    /// `(name, type, shape, offset)` of every tensor, in file order.
    fn tensor_infos<B: AsRef<[u8]>>(gguf: &Gguf<B>) -> Vec<(String, GgmlType, Vec<u64>, u64)> {
        gguf.tensors()
            .map(|t| (t.name.to_owned(), t.ggml_type, t.shape.to_vec(), t.offset))
            .collect()
    }

    fn every_value_type() -> Vec<(&'static str, OwnedValue)> {
        let nested = OwnedValue::array(
            ValueType::Array,
            vec![
                OwnedValue::array(ValueType::U16, vec![OwnedValue::U16(1), OwnedValue::U16(2)])
                    .unwrap(),
                OwnedValue::array(ValueType::U16, vec![]).unwrap(),
                OwnedValue::array(ValueType::U16, vec![OwnedValue::U16(65535)]).unwrap(),
            ],
        )
        .unwrap();
        vec![
            ("t.u8", OwnedValue::U8(200)),
            ("t.i8", OwnedValue::I8(-100)),
            ("t.u16", OwnedValue::U16(60000)),
            ("t.i16", OwnedValue::I16(-30000)),
            ("t.u32", OwnedValue::U32(4_000_000_000)),
            ("t.i32", OwnedValue::I32(-2_000_000_000)),
            ("t.f32", OwnedValue::F32(-1.5e-3)),
            ("t.bool", OwnedValue::Bool(true)),
            ("t.string", OwnedValue::string("héllo")),
            ("t.strings", OwnedValue::strings(["a", "", "ccc"])),
            ("t.nested", nested),
            ("t.u64", OwnedValue::U64(u64::MAX)),
            ("t.i64", OwnedValue::I64(i64::MIN)),
            ("t.f64", OwnedValue::F64(std::f64::consts::PI)),
        ]
    }

    #[test]
    fn round_trips_every_value_type_and_tensor() {
        let mut builder = GgufBuilder::new();
        for (key, value) in every_value_type() {
            builder.metadata(key, value);
        }
        builder
            .alignment(64)
            .tensor("a", GgmlType::F32, &[3, 2], vec![1u8; 24])
            .tensor("b", GgmlType::Q8_0, &[32], vec![2u8; 34])
            .tensor("c", GgmlType::Q4_K, &[256, 1, 1, 2], vec![3u8; 288]);
        let bytes = builder.to_bytes();
        let gguf = Gguf::parse(&bytes[..]).unwrap();

        assert_eq!(metadata_of(&gguf), builder.metadata);
        assert_eq!(gguf.alignment(), 64);
        assert_eq!(gguf.data_offset() % 64, 0);
        let tensors: Vec<_> = gguf.tensors().collect();
        assert_eq!(tensors.len(), builder.tensors.len());
        for (parsed, written) in tensors.iter().zip(&builder.tensors) {
            assert_eq!(parsed.name, written.name);
            assert_eq!(parsed.ggml_type, written.ggml_type);
            assert_eq!(parsed.shape, written.shape);
            assert_eq!(parsed.data, &written.data[..]);
            assert_eq!(parsed.offset % 64, 0);
        }
    }

    #[test]
    fn edits_replace_in_place_and_remove() {
        let mut builder = GgufBuilder::new();
        builder
            .metadata("x", OwnedValue::U8(1))
            .metadata("y", OwnedValue::U8(2))
            .metadata("x", OwnedValue::string("again"))
            .tensor("t0", GgmlType::F32, &[4, 3], vec![0u8; 48])
            .tensor("t1", GgmlType::F16, &[2], vec![0u8; 4]);
        assert_eq!(builder.remove_metadata("y"), Some(OwnedValue::U8(2)));
        assert_eq!(builder.remove_metadata("y"), None);
        assert!(builder.set_tensor_shape("t0", &[6, 2]));
        assert!(!builder.set_tensor_shape("missing", &[1]));
        assert!(builder.remove_tensor("t1"));
        assert!(!builder.remove_tensor("t1"));

        let bytes = builder.to_bytes();
        let gguf = Gguf::parse(&bytes[..]).unwrap();
        assert_eq!(
            metadata_of(&gguf),
            [("x".to_owned(), OwnedValue::string("again"))]
        );
        assert_eq!(
            tensor_infos(&gguf),
            [("t0".to_owned(), GgmlType::F32, vec![6, 2], 0)]
        );
    }

    #[test]
    fn invalid_alignment_is_written_with_default_padding() {
        let mut builder = GgufBuilder::new();
        builder.alignment(3);
        assert_eq!(builder.layout_alignment(), DEFAULT_ALIGNMENT);
        assert_eq!(builder.to_bytes().len() as u64 % DEFAULT_ALIGNMENT, 0);
        builder.metadata(ALIGNMENT_KEY, OwnedValue::U64(128));
        assert_eq!(builder.layout_alignment(), 128);
    }

    #[test]
    fn array_elements_must_share_the_element_type() {
        assert!(
            OwnedArray::new(ValueType::U8, vec![OwnedValue::U8(1), OwnedValue::I8(1)]).is_none()
        );
        assert!(OwnedArray::new(ValueType::Array, vec![]).is_some());
    }

    #[test]
    fn smollm2_copy_parses_back_identical() {
        let original = Gguf::open(Model::SmolLm2.path()).unwrap();
        let bytes = GgufBuilder::from_gguf(&original).to_bytes();
        let copy = Gguf::parse(&bytes[..]).unwrap();

        assert_eq!(metadata_of(&copy), metadata_of(&original));
        assert_eq!(tensor_infos(&copy), tensor_infos(&original));
        assert_eq!(copy.data_offset(), original.data_offset());
        // The writer lays files out as llama.cpp does, so the copy is the original byte for byte.
        assert!(bytes == original.bytes(), "copy differs from the original");
    }
}
