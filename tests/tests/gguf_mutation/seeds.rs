//! The seeds: the synthetic file from the test writer and the SmolLM2 prefix, each with its
//! field map and what the mutation families need to know about it.

use llorch_tests::assets::Model;
use llorch_tests::gguf_writer::{GgufBuilder, OwnedValue};
use worker_common::gguf::{GgmlType, Gguf, ValueType};

use crate::fields::{Field, FieldMap, walk};
use crate::{EXHAUSTIVE_MAX_LEN, SMOL_DATA_KEPT};

/// A seed file and what mutations need to know about it.
pub(crate) struct Seed {
    pub(crate) name: &'static str,
    pub(crate) bytes: Vec<u8>,
    pub(crate) map: FieldMap,
    pub(crate) data_offset: usize,
    /// Whether `bytes` as they are must parse.
    pub(crate) valid: bool,
    /// Whether families target every field and byte; the SmolLM2 prefix is sampled instead,
    /// since each of its cases parses 1.8 MB.
    pub(crate) exhaustive: bool,
    /// End of the last tensor's data: a file cut before it must be refused.
    pub(crate) data_end: usize,
    pub(crate) alignment: u64,
}

impl Seed {
    pub(crate) fn fields(&self) -> &[Field] {
        &self.map.fields
    }
}

/// Deterministic filler bytes for tensor data.
fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

pub(crate) fn nested(levels: usize) -> OwnedValue {
    let innermost = OwnedValue::array(ValueType::U8, vec![OwnedValue::U8(1), OwnedValue::U8(2)]);
    (1..levels).fold(innermost.unwrap(), |inner, _| {
        OwnedValue::array(ValueType::Array, vec![inner]).unwrap()
    })
}

/// The synthetic seed's builder; keys and tensor names come in equal-length groups so that
/// duplicates can be made by copying one over another.
pub(crate) fn synthetic_builder() -> GgufBuilder<'static> {
    let string_arrays = OwnedValue::array(
        ValueType::Array,
        vec![
            OwnedValue::strings(["x", "", "yz"]),
            OwnedValue::strings([]),
            OwnedValue::array(
                ValueType::String,
                vec![OwnedValue::String(vec![0xff, 0xfe])],
            )
            .unwrap(),
        ],
    );
    let mut b = GgufBuilder::new();
    b.metadata("general.architecture", OwnedValue::string("llama"))
        .alignment(64)
        .metadata("s.u8", OwnedValue::U8(0xa5))
        .metadata("s.i8", OwnedValue::I8(-7))
        .metadata("s.u16", OwnedValue::U16(0xbeef))
        .metadata("s.i16", OwnedValue::I16(-300))
        .metadata("s.u32", OwnedValue::U32(0xdead_beef))
        .metadata("s.i32", OwnedValue::I32(-70_000))
        .metadata("s.f32", OwnedValue::F32(0.25))
        .metadata("s.bool", OwnedValue::Bool(true))
        .metadata("s.str", OwnedValue::string("tokenizer ✓"))
        .metadata("s.u64", OwnedValue::U64(1 << 40))
        .metadata("s.i64", OwnedValue::I64(-(1 << 40)))
        .metadata("s.f64", OwnedValue::F64(-2.5))
        .metadata("s.strs", OwnedValue::strings(["<s>", "</s>", "a", ""]))
        .metadata(
            "s.ints",
            OwnedValue::array(ValueType::I32, (0..5).map(OwnedValue::I32).collect()).unwrap(),
        )
        .metadata("s.arrs", string_arrays.unwrap())
        .metadata("s.deep", nested(3))
        .metadata("s.none", OwnedValue::array(ValueType::F32, vec![]).unwrap());
    let tensors: [(&str, GgmlType, &[u64]); 6] = [
        ("w.f32", GgmlType::F32, &[4, 3]),
        ("w.f16", GgmlType::F16, &[8, 2, 2]),
        ("w.q80", GgmlType::Q8_0, &[64, 2]),
        ("w.q4k", GgmlType::Q4_K, &[256, 2]),
        ("w.q6k", GgmlType::Q6_K, &[256]),
        ("w.q41", GgmlType::Q4_1, &[32, 1, 2, 2]),
    ];
    for (salt, (name, ty, shape)) in tensors.into_iter().enumerate() {
        let bytes = ty.bytes_for(shape.iter().product()).unwrap() as usize;
        b.tensor(name, ty, shape, pattern(bytes, salt as u8));
    }
    b
}

/// A seed of `bytes`, laid out as `layout` (the file they come from) says.
fn seed<B: AsRef<[u8]>>(name: &'static str, bytes: Vec<u8>, layout: &Gguf<B>) -> Seed {
    let data_offset = layout.data_offset();
    let data_end = data_end(layout);
    Seed {
        name,
        map: walk(&bytes, data_offset),
        valid: data_end <= bytes.len(),
        exhaustive: bytes.len() <= EXHAUSTIVE_MAX_LEN,
        bytes,
        data_offset,
        data_end,
        alignment: layout.alignment(),
    }
}

pub(crate) fn synthetic_seed() -> Seed {
    let bytes = synthetic_builder().to_bytes();
    let gguf = Gguf::parse(bytes.clone()).expect("the synthetic seed parses");
    seed("synthetic", bytes, &gguf)
}

/// The real SmolLM2 up to its data section plus a little data: its layout, not its weights.
pub(crate) fn smol_seed() -> Seed {
    let gguf = Gguf::open(Model::SmolLm2.path()).unwrap();
    let bytes = gguf.bytes()[..gguf.data_offset() + SMOL_DATA_KEPT].to_vec();
    seed("smollm2-prefix", bytes, &gguf)
}

fn data_end<B: AsRef<[u8]>>(gguf: &Gguf<B>) -> usize {
    gguf.tensors()
        .map(|t| gguf.data_offset() + t.offset as usize + t.data.len())
        .max()
        .unwrap_or(gguf.data_offset())
}
