#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Mutation test of the GGUF reader: thousands of deterministic corruptions of two seed files.
//!
//! Every case asserts that `Gguf::parse` returns (never panics), that it stays within a heap
//! budget of 8 × the file length + 64 KiB, that an accepted file is self-consistent (each tensor's
//! bytes lie inside the file and have the length its type and shape imply), and, where the
//! corruption makes the file certainly invalid, that it is refused.
//!
//! Seeds: a synthetic file from the test writer (all 13 value types, nested arrays, six tensors
//! of six ggml types, alignment 64) and the header of the real SmolLM2 (up to its data section,
//! plus 4 KiB of data), which is refused as it is because its tensors lie outside the prefix.
//!
//! [`EXPECTED_CASES`] lists the families and their exact case counts; `walk` finds every field
//! of a seed so that families can target counts, lengths, type ids and offsets by position.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, BTreeSet};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use llorch_tests::assets::Model;
use llorch_tests::gguf_writer::{GgufBuilder, OwnedArray, OwnedValue, value_type_id};
use worker_common::gguf::{
    ALIGNMENT_KEY, GgmlType, Gguf, GgufError, MAX_ARRAY_DEPTH, Value, ValueType,
};

/// Cases per mutation family. The test fails if a family runs another number of cases, so this
/// table documents the families and cannot drift from them. "All fields" means every field of the
/// synthetic seed plus a sample of the SmolLM2 prefix's (`SMOL_TARGETS` top-level fields of the
/// kind and the first 4 inside arrays), since each case on the prefix parses 1.8 MB.
const EXPECTED_CASES: &[(&str, usize)] = &[
    // Both seeds unchanged: the synthetic one parses, the SmolLM2 prefix is refused.
    ("seeds", 2),
    // Cuts at both ends of every field (magic, version, counts, key lengths, keys, value types,
    // values, array types, counts and elements, tensor names, n_dims, dims, types, offsets,
    // padding) and at every 7th offset of the synthetic seed; cuts at 300 top-level field
    // boundaries, every 997th field inside arrays and 64 even offsets of the SmolLM2 prefix.
    ("truncate", 1485),
    // XOR 0x01, 0x80 and 0xff at every byte before the synthetic seed's data section, and at the
    // first and last 256 bytes before the prefix's data section.
    ("flip", 4608),
    // Every count, string length, array count, tensor name length and dimension set to u64::MAX,
    // 2^63, i64::MAX, 2^60, 2^32, u32::MAX, the file length, the file length + 1, what remains + 1,
    // the original + 1 and 0; plus 16,384 dense metadata entries with and without the largest
    // tensor count the count check admits.
    ("huge", 1300),
    // Value type ids and array element type ids set to each other known id and to 13, 14, 255,
    // 256, 2^16, 2^31, u32::MAX; ggml type ids set to each id in 0..=45 and 256, 1000, 2^31,
    // u32::MAX.
    ("type_ids", 1737),
    // n_dims set to 0..=6, 255, 2^31 and u32::MAX.
    ("n_dims", 162),
    // Tensor offsets set to each other tensor's offset, past the end of the file, u64::MAX,
    // 2^63, off the alignment, and one alignment unit up or down.
    ("tensor_offsets", 306),
    // general.alignment set to 0, 3, 2^31, other non-powers and every other power of two below
    // 2^31; and written as u8, u16, i32, u64, i64, out-of-range, float, bool, string and array.
    ("alignment", 53),
    // A key (tensor name) copied over another of the same length: every pair in the synthetic
    // seed, 24 pairs of keys and 24 of names in the SmolLM2 prefix.
    ("duplicates", 115),
    // Arrays nested 1..=100 levels deep, and 10,000 levels with counts of 1 and of 2^60.
    ("nesting", 102),
    // One to four random edits (byte writes, edge values written into fields, deletions,
    // insertions, copies, truncations) from a fixed-seed SplitMix64.
    ("random", RANDOM_CASES),
];

/// Heap budget of one parse: a multiple of the file length plus a constant.
const HEAP_FACTOR: usize = 8;
const HEAP_SLACK: usize = 64 * 1024;

/// Seeds up to this length are mutated at every field and byte.
const EXHAUSTIVE_MAX_LEN: usize = 64 * 1024;

/// Bytes of tensor data kept after the header of the SmolLM2 prefix.
const SMOL_DATA_KEPT: usize = 4096;

// --- Heap accounting -------------------------------------------------------------------------

/// Counts live heap bytes and their high-water mark, so a test can bound what one parse costs.
struct CountingAllocator;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let live = LIVE.fetch_add(bytes, Ordering::SeqCst) + bytes;
    PEAK.fetch_max(live, Ordering::SeqCst);
}

fn shrank(bytes: usize) {
    LIVE.fetch_sub(bytes, Ordering::SeqCst);
}

// SAFETY: every call is forwarded unchanged to `System`; the counters never touch the memory.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which `System` shares.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, hence from `System`, with this layout.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`; the caller upholds `realloc`'s size contract.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                shrank(layout.size() - new_size);
            }
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// The counters are process-wide, so the tests of this binary take turns.
static MEASURING: Mutex<()> = Mutex::new(());

fn measuring() -> MutexGuard<'static, ()> {
    MEASURING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `f` and returns its result with the peak heap growth while it ran.
fn measure<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let out = f();
    (out, PEAK.load(Ordering::SeqCst).saturating_sub(base))
}

// --- Field map of a valid file ---------------------------------------------------------------

/// What a field of a GGUF file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Magic,
    Version,
    TensorCount,
    MetadataCount,
    KeyLen,
    Key,
    ValueType,
    Scalar,
    StringLen,
    StringBytes,
    ArrayType,
    ArrayCount,
    ArrayElements,
    NameLen,
    Name,
    NDims,
    Dim,
    GgmlType,
    Offset,
    Padding,
}

/// One field: where it is, and how many arrays enclose it (0 outside arrays).
#[derive(Debug, Clone, Copy)]
struct Field {
    kind: Kind,
    start: usize,
    len: usize,
    depth: usize,
}

impl Field {
    fn end(&self) -> usize {
        self.start + self.len
    }
}

/// The fields of a valid file's header, metadata and tensor infos, in file order.
struct FieldMap {
    fields: Vec<Field>,
    /// Start of the u32 value of `general.alignment`, when the file has one.
    alignment_value: Option<usize>,
}

impl FieldMap {
    fn of(&self, kind: Kind) -> impl Iterator<Item = Field> + '_ {
        self.fields.iter().copied().filter(move |f| f.kind == kind)
    }
}

/// A trusting reader of valid files that records every field it passes.
struct Walker<'a> {
    bytes: &'a [u8],
    pos: usize,
    depth: usize,
    fields: Vec<Field>,
}

impl Walker<'_> {
    fn field(&mut self, kind: Kind, len: usize) -> &[u8] {
        let start = self.pos;
        self.pos += len;
        let depth = self.depth;
        self.fields.push(Field {
            kind,
            start,
            len,
            depth,
        });
        &self.bytes[start..self.pos]
    }

    fn u32(&mut self, kind: Kind) -> u32 {
        u32::from_le_bytes(self.field(kind, 4).try_into().unwrap())
    }

    fn u64(&mut self, kind: Kind) -> u64 {
        u64::from_le_bytes(self.field(kind, 8).try_into().unwrap())
    }

    fn string(&mut self, len_kind: Kind, kind: Kind) -> &[u8] {
        let len = self.u64(len_kind) as usize;
        self.field(kind, len)
    }

    fn value(&mut self, ty: ValueType) {
        match (ty, ty.fixed_size()) {
            (_, Some(size)) => {
                self.field(Kind::Scalar, size as usize);
            }
            (ValueType::String, None) => {
                self.string(Kind::StringLen, Kind::StringBytes);
            }
            _ => self.array(),
        }
    }

    fn array(&mut self) {
        let ty = ValueType::from_id(self.u32(Kind::ArrayType)).unwrap();
        let count = self.u64(Kind::ArrayCount);
        self.depth += 1;
        match ty.fixed_size() {
            Some(size) => {
                self.field(Kind::ArrayElements, (count * size) as usize);
            }
            None => (0..count).for_each(|_| self.value(ty)),
        }
        self.depth -= 1;
    }
}

/// Maps the fields of `bytes`, a file whose header, metadata and tensor infos are valid.
fn walk(bytes: &[u8], data_offset: usize) -> FieldMap {
    let mut w = Walker {
        bytes,
        pos: 0,
        depth: 0,
        fields: Vec::new(),
    };
    w.field(Kind::Magic, 4);
    w.u32(Kind::Version);
    let tensors = w.u64(Kind::TensorCount);
    let entries = w.u64(Kind::MetadataCount);
    let mut alignment_value = None;
    for _ in 0..entries {
        let is_alignment = w.string(Kind::KeyLen, Kind::Key) == ALIGNMENT_KEY.as_bytes();
        let ty = ValueType::from_id(w.u32(Kind::ValueType)).unwrap();
        if is_alignment {
            alignment_value = Some(w.pos);
        }
        w.value(ty);
    }
    for _ in 0..tensors {
        w.string(Kind::NameLen, Kind::Name);
        let n_dims = w.u32(Kind::NDims);
        (0..n_dims).for_each(|_| {
            w.u64(Kind::Dim);
        });
        w.u32(Kind::GgmlType);
        w.u64(Kind::Offset);
    }
    w.field(Kind::Padding, data_offset - w.pos);
    FieldMap {
        fields: w.fields,
        alignment_value,
    }
}

// --- Seeds ------------------------------------------------------------------------------------

/// A seed file and what mutations need to know about it.
struct Seed {
    name: &'static str,
    bytes: Vec<u8>,
    map: FieldMap,
    data_offset: usize,
    /// Whether `bytes` as they are must parse.
    valid: bool,
    /// Whether families target every field and byte; the SmolLM2 prefix is sampled instead,
    /// since each of its cases parses 1.8 MB.
    exhaustive: bool,
    /// End of the last tensor's data: a file cut before it must be refused.
    data_end: usize,
    alignment: u64,
}

impl Seed {
    fn fields(&self) -> &[Field] {
        &self.map.fields
    }
}

/// Deterministic filler bytes for tensor data.
fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

fn nested(levels: usize) -> OwnedValue {
    let innermost = OwnedValue::array(ValueType::U8, vec![OwnedValue::U8(1), OwnedValue::U8(2)]);
    (1..levels).fold(innermost.unwrap(), |inner, _| {
        OwnedValue::array(ValueType::Array, vec![inner]).unwrap()
    })
}

/// The synthetic seed's builder; keys and tensor names come in equal-length groups so that
/// duplicates can be made by copying one over another.
fn synthetic_builder() -> GgufBuilder<'static> {
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

fn synthetic_seed() -> Seed {
    let bytes = synthetic_builder().to_bytes();
    let gguf = Gguf::parse(bytes.clone()).expect("the synthetic seed parses");
    seed("synthetic", bytes, &gguf)
}

/// The real SmolLM2 up to its data section plus a little data: its layout, not its weights.
fn smol_seed() -> Seed {
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

// --- Running cases ----------------------------------------------------------------------------

/// What a case's file must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Parse or be refused; either way without panicking.
    Any,
    /// Be refused: the mutation makes the file certainly invalid.
    Err,
    /// Parse.
    Ok,
}

/// Runs cases and collects what went wrong, so one run reports every failing case.
#[derive(Default)]
struct Runner {
    cases: usize,
    per_family: BTreeMap<&'static str, usize>,
    failures: Vec<String>,
    worst_ratio: f64,
    worst_case: String,
}

impl Runner {
    fn case(&mut self, family: &'static str, desc: String, expect: Expect, bytes: &[u8]) {
        let label = format!("case #{} [{family}] {desc}", self.cases);
        self.cases += 1;
        *self.per_family.entry(family).or_default() += 1;
        if let Err(problem) = self.check(expect, bytes, &label) {
            self.failures.push(format!("{label}: {problem}"));
        }
    }

    fn check(&mut self, expect: Expect, bytes: &[u8], label: &str) -> Result<(), String> {
        let (outcome, peak) = measure(|| panic::catch_unwind(|| Gguf::parse(bytes)));
        let ratio = peak as f64 / bytes.len().max(1) as f64;
        if ratio > self.worst_ratio {
            self.worst_ratio = ratio;
            self.worst_case = label.to_owned();
        }
        if peak > HEAP_FACTOR * bytes.len() + HEAP_SLACK {
            let len = bytes.len();
            return Err(format!(
                "parse peaked at {peak} heap bytes for {len} file bytes"
            ));
        }
        let parsed =
            outcome.map_err(|payload| format!("parse panicked: {}", panic_message(&*payload)))?;
        match (parsed, expect) {
            (Ok(_), Expect::Err) => Err("accepted a file that must be refused".to_owned()),
            (Err(err), Expect::Ok) => Err(format!("refused a valid file: {err}")),
            (Err(_), _) => Ok(()),
            (Ok(gguf), _) => panic::catch_unwind(AssertUnwindSafe(|| consistent(&gguf, bytes)))
                .unwrap_or_else(|payload| {
                    Err(format!("accessor panicked: {}", panic_message(&*payload)))
                }),
        }
    }

    /// Prints the counts and the worst heap ratio; fails on any failing case, or when the
    /// families ran other numbers of cases than `expected`.
    fn finish(self, expected: &[(&'static str, usize)]) {
        eprintln!("gguf_mutation: {} cases", self.cases);
        for (family, count) in &self.per_family {
            eprintln!("  {family:<15} {count:>6}");
        }
        eprintln!(
            "gguf_mutation: worst heap ratio {:.2} × file length ({})",
            self.worst_ratio, self.worst_case
        );
        let shown: Vec<&String> = self.failures.iter().take(30).collect();
        assert!(
            self.failures.is_empty(),
            "{} failing cases, first ones:\n{shown:#?}",
            self.failures.len()
        );
        let expected: BTreeMap<&str, usize> = expected.iter().copied().collect();
        assert_eq!(
            self.per_family, expected,
            "case counts differ from the documented ones"
        );
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

// --- Self-consistency of an accepted file -----------------------------------------------------

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// Checks what an accepted file exposes against the file itself.
fn consistent(gguf: &Gguf<&[u8]>, file: &[u8]) -> Result<(), String> {
    let alignment = gguf.alignment();
    ensure!(alignment.is_power_of_two(), "alignment {alignment}");
    ensure!(
        gguf.data_offset() as u64 % alignment == 0,
        "data offset {} unaligned",
        gguf.data_offset()
    );
    for (key, value) in gguf.metadata() {
        ensure!(
            gguf.get(key).is_some_and(|v| same(v, value)),
            "lookup of key {key:?}"
        );
        walk_value(value, 0)?;
    }
    let mut spans = Vec::new();
    for tensor in gguf.tensors() {
        spans.push(tensor_span(gguf, file, tensor.name)?);
    }
    spans.sort_unstable();
    for pair in spans.windows(2) {
        ensure!(
            pair[0].1 <= pair[1].0,
            "tensor data {:?} and {:?} overlap",
            pair[0],
            pair[1]
        );
    }
    Ok(())
}

/// Checks one tensor's size, position and lookup; returns its byte range in the file.
fn tensor_span(gguf: &Gguf<&[u8]>, file: &[u8], name: &str) -> Result<(usize, usize), String> {
    let t = gguf
        .tensor(name)
        .ok_or_else(|| format!("lookup of tensor {name:?}"))?;
    ensure!(
        (1..=4).contains(&t.shape.len()),
        "{name:?}: {} dims",
        t.shape.len()
    );
    let (block, block_bytes) = (t.ggml_type.block_size(), t.ggml_type.block_bytes());
    ensure!(
        t.shape[0] % block == 0,
        "{name:?}: row {} not whole blocks",
        t.shape[0]
    );
    let size = t
        .shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .and_then(|n| (n / block).checked_mul(block_bytes));
    ensure!(
        size == Some(t.data.len() as u64),
        "{name:?}: {} bytes for shape {:?}",
        t.data.len(),
        t.shape
    );
    let start = (t.data.as_ptr() as usize).wrapping_sub(file.as_ptr() as usize);
    let end = start
        .checked_add(t.data.len())
        .filter(|&end| end <= file.len());
    let end = end.ok_or_else(|| format!("{name:?}: data lies outside the file"))?;
    ensure!(
        start as u64 == gguf.data_offset() as u64 + t.offset,
        "{name:?}: data not at its offset"
    );
    ensure!(
        t.offset % gguf.alignment() == 0,
        "{name:?}: offset {} unaligned",
        t.offset
    );
    Ok((start, end))
}

/// Iterates an array down to its innermost elements, checking types and counts.
fn walk_value(value: Value<'_>, depth: usize) -> Result<(), String> {
    let Value::Array(array) = value else {
        return Ok(());
    };
    ensure!(depth < MAX_ARRAY_DEPTH, "arrays nested {} deep", depth + 1);
    let mut seen = 0u64;
    for element in array.iter() {
        ensure!(
            element.value_type() == array.element_type(),
            "element of another type"
        );
        walk_value(element, depth + 1)?;
        seen += 1;
    }
    ensure!(
        seen == array.len(),
        "array of {} yields {seen}",
        array.len()
    );
    Ok(())
}

/// Equality that holds for NaN floats too: files may store any bit pattern.
fn same(a: Value<'_>, b: Value<'_>) -> bool {
    match (a, b) {
        (Value::F32(x), Value::F32(y)) => x.to_bits() == y.to_bits(),
        (Value::F64(x), Value::F64(y)) => x.to_bits() == y.to_bits(),
        _ => a == b,
    }
}

// --- Mutation helpers -------------------------------------------------------------------------

/// A copy of `bytes` with `field` (2, 4 or 8 bytes) set to `value`, truncated to its width.
fn with_int(bytes: &[u8], field: Field, value: u64) -> Vec<u8> {
    let mut out = bytes.to_vec();
    out[field.start..field.end()].copy_from_slice(&value.to_le_bytes()[..field.len]);
    out
}

/// The little-endian integer stored in `field`.
fn int_at(bytes: &[u8], field: Field) -> u64 {
    let mut wide = [0u8; 8];
    wide[..field.len].copy_from_slice(&bytes[field.start..field.end()]);
    u64::from_le_bytes(wide)
}

/// At most `max` items, spread evenly from the first to the last.
fn thin<T: Copy>(items: &[T], max: usize) -> Vec<T> {
    if items.len() <= max {
        return items.to_vec();
    }
    (0..max)
        .map(|i| items[i * (items.len() - 1) / (max - 1).max(1)])
        .collect()
}

/// The fields of `kind` a family targets: all of them in an exhaustive seed; else at most
/// `SMOL_TARGETS` top-level ones and the first few inside arrays.
fn targets(seed: &Seed, kind: Kind) -> Vec<Field> {
    let all: Vec<Field> = seed.map.of(kind).collect();
    if seed.exhaustive {
        return all;
    }
    let (top, nested): (Vec<Field>, Vec<Field>) = all.into_iter().partition(|f| f.depth == 0);
    let mut picked = thin(&top, SMOL_TARGETS);
    picked.extend(nested.iter().take(4));
    picked
}

/// Fields of a kind a family targets in a sampled seed.
const SMOL_TARGETS: usize = 12;

const HUGE_VALUES: [(u64, &str); 6] = [
    (u64::MAX, "u64::MAX"),
    (1 << 63, "2^63"),
    (i64::MAX as u64, "i64::MAX"),
    (1 << 60, "2^60"),
    (1 << 32, "2^32"),
    (u32::MAX as u64, "u32::MAX"),
];

// --- Families ---------------------------------------------------------------------------------

/// The seeds as they are.
fn seeds(r: &mut Runner, seeds: &[Seed]) {
    for seed in seeds {
        let expect = if seed.valid { Expect::Ok } else { Expect::Err };
        r.case("seeds", seed.name.to_owned(), expect, &seed.bytes);
    }
}

/// Cuts at every field boundary (sampled in the SmolLM2 prefix) and at other offsets; a file cut
/// before its last tensor's data ends must be refused.
fn truncate(r: &mut Runner, seed: &Seed) {
    let len = seed.bytes.len();
    let mut cuts = BTreeSet::new();
    let fields = if seed.exhaustive {
        seed.fields().to_vec()
    } else {
        let top: Vec<Field> = seed
            .fields()
            .iter()
            .copied()
            .filter(|f| f.depth == 0)
            .collect();
        let mut sample = thin(&top, 300);
        sample.extend(seed.fields().iter().step_by(997));
        sample
    };
    for field in fields {
        cuts.extend([field.start, field.end()]);
    }
    let step = if seed.exhaustive { 7 } else { len / 64 };
    cuts.extend((0..len).step_by(step));
    cuts.insert(len - 1);
    cuts.remove(&len);
    for cut in cuts {
        let expect = if cut < seed.data_end {
            Expect::Err
        } else {
            Expect::Any
        };
        r.case(
            "truncate",
            format!("{} cut at {cut}", seed.name),
            expect,
            &seed.bytes[..cut],
        );
    }
}

/// Flips bits of every byte before the data section (the first and last 256 in the SmolLM2
/// prefix) with three masks.
fn flip(r: &mut Runner, seed: &Seed) {
    let positions: Vec<usize> = if seed.exhaustive {
        (0..seed.data_offset).collect()
    } else {
        (0..256)
            .chain(seed.data_offset - 256..seed.data_offset)
            .collect()
    };
    for at in positions {
        for mask in [0x01u8, 0x80, 0xff] {
            let mut bytes = seed.bytes.clone();
            bytes[at] ^= mask;
            r.case(
                "flip",
                format!("{} byte {at} ^ {mask:#04x}", seed.name),
                Expect::Any,
                &bytes,
            );
        }
    }
}

/// Sets counts, lengths and dimensions to values far beyond what the file holds.
fn huge(r: &mut Runner, seed: &Seed) {
    let kinds = [
        Kind::TensorCount,
        Kind::MetadataCount,
        Kind::KeyLen,
        Kind::StringLen,
        Kind::ArrayCount,
        Kind::NameLen,
        Kind::Dim,
    ];
    let len = seed.bytes.len() as u64;
    for kind in kinds {
        for field in targets(seed, kind) {
            let remaining = len - field.end() as u64;
            let original = int_at(&seed.bytes, field);
            let mut values = HUGE_VALUES.to_vec();
            values.extend([
                (len, "file length"),
                (len + 1, "file length + 1"),
                (remaining + 1, "remaining + 1"),
                (original + 1, "original + 1"),
                (0, "0"),
            ]);
            for (value, label) in values {
                let expect = huge_expectation(kind, value, len, remaining);
                let desc = format!("{} {kind:?} at {} = {label}", seed.name, field.start);
                r.case("huge", desc, expect, &with_int(&seed.bytes, field, value));
            }
        }
    }
}

/// A count or length needs at least one byte per unit after its field; a dimension needs at
/// least one byte per 8 elements (the densest ggml type, IQ1_S, spends 50 bytes on 256), and
/// must not be 0.
fn huge_expectation(kind: Kind, value: u64, len: u64, remaining: u64) -> Expect {
    let certainly_invalid = match kind {
        Kind::Dim => value == 0 || value / 8 > len,
        _ => value > remaining,
    };
    if certainly_invalid {
        Expect::Err
    } else {
        Expect::Any
    }
}

/// A file of `entries` minimal metadata entries with distinct two-byte keys claiming as many
/// tensors as the count check lets through: the most parse can allocate per file byte.
fn dense_metadata(r: &mut Runner) {
    let entries = 128 * 128;
    let mut body = Vec::new();
    for i in 0..entries {
        body.extend_from_slice(&2u64.to_le_bytes());
        body.extend_from_slice(&[(i / 128) as u8, (i % 128) as u8]);
        body.extend_from_slice(&value_type_id(ValueType::U8).to_le_bytes());
        body.push(i as u8);
    }
    // The count check admits a tensor per 32 bytes after the count.
    let max_tensors = (8 + body.len() as u64) / 32;
    for (tensors, expect) in [(0, Expect::Ok), (max_tensors, Expect::Err)] {
        let mut file = b"GGUF".to_vec();
        file.extend_from_slice(&3u32.to_le_bytes());
        file.extend_from_slice(&tensors.to_le_bytes());
        file.extend_from_slice(&(entries as u64).to_le_bytes());
        file.extend_from_slice(&body);
        let desc = format!("{entries} one-byte entries, {tensors} tensors claimed");
        r.case("huge", desc, expect, &file);
    }
}

/// Value type ids (of entries and of array elements) and ggml type ids set to every known id
/// and to ids out of range; unknown ids must be refused.
fn type_ids(r: &mut Runner, seed: &Seed) {
    let out_of_range = [13, 14, 255, 256, 1 << 16, 1 << 31, u32::MAX];
    for field in [Kind::ValueType, Kind::ArrayType]
        .iter()
        .flat_map(|&k| targets(seed, k))
    {
        let original = int_at(&seed.bytes, field) as u32;
        let known = (0..=12).filter(|&id| id != original);
        for id in known.chain(out_of_range) {
            let expect = if ValueType::from_id(id).is_some() {
                Expect::Any
            } else {
                Expect::Err
            };
            let desc = format!("{} {:?} at {} = {id}", seed.name, field.kind, field.start);
            r.case(
                "type_ids",
                desc,
                expect,
                &with_int(&seed.bytes, field, id.into()),
            );
        }
    }
    for field in targets(seed, Kind::GgmlType) {
        let original = int_at(&seed.bytes, field) as u32;
        let ids = (0..=45).filter(|&id| id != original);
        for id in ids.chain([256, 1000, 1 << 31, u32::MAX]) {
            let expect = if GgmlType::from_id(id).is_some() {
                Expect::Any
            } else {
                Expect::Err
            };
            let desc = format!("{} ggml type at {} = {id}", seed.name, field.start);
            r.case(
                "type_ids",
                desc,
                expect,
                &with_int(&seed.bytes, field, id.into()),
            );
        }
    }
}

/// Tensor dimension counts outside 1..=4 must be refused; other counts in range shift the
/// fields after them.
fn n_dims(r: &mut Runner, seed: &Seed) {
    for field in targets(seed, Kind::NDims) {
        let original = int_at(&seed.bytes, field);
        for value in [0, 1, 2, 3, 4, 5, 6, 255, 1 << 31, u64::from(u32::MAX)] {
            if value == original {
                continue;
            }
            let expect = if (1..=4).contains(&value) {
                Expect::Any
            } else {
                Expect::Err
            };
            let desc = format!("{} n_dims at {} = {value}", seed.name, field.start);
            r.case("n_dims", desc, expect, &with_int(&seed.bytes, field, value));
        }
    }
}

/// Tensor offsets moved onto another tensor, past the file, or off the alignment.
fn tensor_offsets(r: &mut Runner, seed: &Seed) {
    let fields = targets(seed, Kind::Offset);
    let offsets: Vec<u64> = fields.iter().map(|&f| int_at(&seed.bytes, f)).collect();
    let align = seed.alignment;
    let data_len = (seed.bytes.len() - seed.data_offset) as u64;
    let past_end = data_len.next_multiple_of(align);
    for (i, &field) in fields.iter().enumerate() {
        let own = offsets[i];
        let mut values: Vec<(u64, Expect)> = offsets
            .iter()
            .filter(|&&other| other != own)
            .map(|&other| (other, Expect::Err))
            .collect();
        values.extend([
            (u64::MAX, Expect::Err),
            (1 << 63, Expect::Err),
            (past_end, Expect::Err),
            (past_end + 1024 * align, Expect::Err),
            (own + 1, Expect::Err),
            (own + align / 2, Expect::Err),
            (own + align, Expect::Any),
            (own.saturating_sub(align), Expect::Any),
        ]);
        for (value, expect) in values {
            let desc = format!("{} offset at {} = {value}", seed.name, field.start);
            r.case(
                "tensor_offsets",
                desc,
                expect,
                &with_int(&seed.bytes, field, value),
            );
        }
    }
}

/// `general.alignment` patched to other values, and written with other value types.
fn alignment(r: &mut Runner, seed: &Seed) {
    let Some(start) = seed.map.alignment_value else {
        return;
    };
    let field = Field {
        kind: Kind::Scalar,
        start,
        len: 4,
        depth: 0,
    };
    let invalid = [0, 3, 5, 6, 48, 63, 65, 96, (1 << 31) + 1, u32::MAX];
    let powers = (0..31)
        .map(|shift| 1u32 << shift)
        .filter(|&a| u64::from(a) != seed.alignment);
    // 2^31 is a power of two, but it puts the data section past the end of any test file.
    let values = invalid
        .into_iter()
        .chain([1 << 31])
        .map(|v| (v, Expect::Err));
    for (value, expect) in values.chain(powers.map(|v| (v, Expect::Any))) {
        let desc = format!("{} alignment = {value}", seed.name);
        r.case(
            "alignment",
            desc,
            expect,
            &with_int(&seed.bytes, field, value.into()),
        );
    }
    let typed = [
        (OwnedValue::U8(64), Expect::Ok),
        (OwnedValue::U16(64), Expect::Ok),
        (OwnedValue::I32(64), Expect::Ok),
        (OwnedValue::U64(64), Expect::Ok),
        (OwnedValue::I64(64), Expect::Ok),
        (OwnedValue::U64(1 << 32), Expect::Err),
        (OwnedValue::I64(-64), Expect::Err),
        (OwnedValue::I8(-1), Expect::Err),
        (OwnedValue::F32(64.0), Expect::Err),
        (OwnedValue::Bool(true), Expect::Err),
        (OwnedValue::string("64"), Expect::Err),
        (
            OwnedValue::array(ValueType::U32, vec![OwnedValue::U32(64)]).unwrap(),
            Expect::Err,
        ),
    ];
    for (value, expect) in typed {
        let desc = format!("alignment written as {value:?}");
        let bytes = synthetic_builder()
            .metadata(ALIGNMENT_KEY, value)
            .to_bytes();
        r.case("alignment", desc, expect, &bytes);
    }
}

/// One key (tensor name) copied over another of the same length: a repeated key (name) must be
/// refused.
fn duplicates(r: &mut Runner, seed: &Seed) {
    for kind in [Kind::Key, Kind::Name] {
        let fields: Vec<Field> = seed.map.of(kind).collect();
        let mut pairs = Vec::new();
        for (i, a) in fields.iter().enumerate() {
            for b in &fields[i + 1..] {
                let differ = seed.bytes[a.start..a.end()] != seed.bytes[b.start..b.end()];
                if a.len == b.len && differ {
                    pairs.push((*a, *b));
                }
            }
        }
        let max = if seed.exhaustive {
            pairs.len()
        } else {
            2 * SMOL_TARGETS
        };
        for (a, b) in thin(&pairs, max) {
            let mut bytes = seed.bytes.clone();
            bytes.copy_within(a.start..a.end(), b.start);
            let desc = format!(
                "{} {kind:?} at {} copied to {}",
                seed.name, a.start, b.start
            );
            r.case("duplicates", desc, Expect::Err, &bytes);
        }
    }
}

/// Arrays of arrays nested 1 to 100 levels deep (accepted up to `MAX_ARRAY_DEPTH`), and 10,000
/// levels written by hand, once with sane counts and once with every level claiming 2^60.
fn nesting(r: &mut Runner) {
    for levels in 1..=100 {
        let bytes = GgufBuilder::new()
            .metadata("deep", nested(levels))
            .to_bytes();
        let expect = if levels <= MAX_ARRAY_DEPTH {
            Expect::Ok
        } else {
            Expect::Err
        };
        r.case("nesting", format!("{levels} levels"), expect, &bytes);
    }
    for (count, label) in [(1u64, "1"), (1 << 60, "2^60")] {
        let mut file = b"GGUF".to_vec();
        file.extend_from_slice(&3u32.to_le_bytes());
        file.extend_from_slice(&0u64.to_le_bytes());
        file.extend_from_slice(&1u64.to_le_bytes());
        file.extend_from_slice(&4u64.to_le_bytes());
        file.extend_from_slice(b"deep");
        file.extend_from_slice(&value_type_id(ValueType::Array).to_le_bytes());
        for _ in 0..10_000 {
            file.extend_from_slice(&value_type_id(ValueType::Array).to_le_bytes());
            file.extend_from_slice(&count.to_le_bytes());
        }
        file.extend_from_slice(&value_type_id(ValueType::U8).to_le_bytes());
        file.extend_from_slice(&0u64.to_le_bytes());
        r.case(
            "nesting",
            format!("10000 levels of count {label}"),
            Expect::Err,
            &file,
        );
    }
}

/// SplitMix64: a tiny, well-mixed generator, seeded so that every run makes the same cases.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`, or 0 when `n` is 0.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Integers that sit on the edges the reader checks.
const INTERESTING: [u64; 20] = [
    0,
    1,
    2,
    4,
    5,
    8,
    9,
    12,
    13,
    32,
    63,
    255,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    1 << 32,
    1 << 60,
    i64::MAX as u64,
    1 << 63,
    u64::MAX,
];

const RANDOM_CASES: usize = 2000;

/// Cases of one to four random edits each, three quarters on the synthetic seed.
fn random(r: &mut Runner, seeds: &[Seed]) {
    let mut rng = SplitMix64(0x6c6c_6f72_6368_6767);
    for _ in 0..RANDOM_CASES {
        let seed = if rng.below(4) == 0 {
            &seeds[1]
        } else {
            &seeds[0]
        };
        let mut bytes = seed.bytes.clone();
        let edits: Vec<String> = (0..1 + rng.below(4))
            .map(|_| random_edit(&mut rng, seed, &mut bytes))
            .collect();
        let desc = format!("{}: {}", seed.name, edits.join(", "));
        r.case("random", desc, Expect::Any, &bytes);
    }
}

/// Applies one random edit, mostly before the data section; returns what it did.
fn random_edit(rng: &mut SplitMix64, seed: &Seed, bytes: &mut Vec<u8>) -> String {
    let at = rng.below(bytes.len().min(seed.data_offset + 64));
    let fields = seed.fields();
    let field = fields[rng.below(fields.len())];
    match rng.below(6) {
        0 if at < bytes.len() => {
            let value = rng.next() as u8;
            bytes[at] = value;
            format!("byte {at} = {value:#04x}")
        }
        1 if field.end() <= bytes.len() && [1, 2, 4, 8].contains(&field.len) => {
            let value = INTERESTING[rng.below(INTERESTING.len())];
            *bytes = with_int(bytes, field, value);
            format!("{:?} at {} = {value}", field.kind, field.start)
        }
        2 => {
            let end = (at + 1 + rng.below(16)).min(bytes.len());
            bytes.drain(at..end);
            format!("delete {at}..{end}")
        }
        3 => {
            let n = 1 + rng.below(16);
            let inserted: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            bytes.splice(at..at, inserted);
            format!("insert {n} bytes at {at}")
        }
        4 => {
            let from = rng.below(bytes.len());
            let n = (1 + rng.below(64))
                .min(bytes.len() - from)
                .min(bytes.len() - at);
            bytes.copy_within(from..from + n, at);
            format!("copy {from}..{} to {at}", from + n)
        }
        _ => {
            bytes.truncate(at);
            format!("truncate at {at}")
        }
    }
}

// --- Tests ------------------------------------------------------------------------------------

#[test]
fn mutations_never_panic_stay_in_budget_and_accept_only_consistent_files() {
    let _turn = measuring();
    let started = std::time::Instant::now();
    let seeds = [synthetic_seed(), smol_seed()];
    let mut r = Runner::default();
    self::seeds(&mut r, &seeds);
    for seed in &seeds {
        truncate(&mut r, seed);
        flip(&mut r, seed);
        huge(&mut r, seed);
        type_ids(&mut r, seed);
        n_dims(&mut r, seed);
        tensor_offsets(&mut r, seed);
        alignment(&mut r, seed);
        duplicates(&mut r, seed);
    }
    dense_metadata(&mut r);
    nesting(&mut r);
    random(&mut r, &seeds);
    eprintln!("gguf_mutation: ran in {:.1?}", started.elapsed());
    assert!(r.cases >= 5000, "only {} cases", r.cases);
    r.finish(EXPECTED_CASES);
}

#[test]
fn sixteen_byte_file_claiming_2_pow_60_tensors_fails_at_once() {
    let _turn = measuring();
    let mut file = b"GGUF".to_vec();
    file.extend_from_slice(&3u32.to_le_bytes());
    file.extend_from_slice(&(1u64 << 60).to_le_bytes());
    assert_eq!(file.len(), 16);
    let (result, peak) = measure(|| Gguf::parse(&file[..]).map(|_| ()));
    assert!(
        matches!(result, Err(GgufError::CountTooLarge { count, .. }) if count == 1 << 60),
        "{result:?}"
    );
    // The error names what was counted; nothing is sized by the claimed count.
    assert!(peak <= 64, "parse allocated {peak} bytes");
}

/// A key of 1 MiB followed by a value the reader refuses; the key is plain text, or control
/// characters that `{:?}` escapes to five or six characters each.
fn long_key_file(key_byte: u8, tail: &[u8]) -> Vec<u8> {
    let key = vec![key_byte; 1 << 20];
    let mut file = b"GGUF".to_vec();
    file.extend_from_slice(&3u32.to_le_bytes());
    file.extend_from_slice(&0u64.to_le_bytes());
    file.extend_from_slice(&1u64.to_le_bytes());
    file.extend_from_slice(&(key.len() as u64).to_le_bytes());
    file.extend_from_slice(&key);
    file.extend_from_slice(tail);
    file
}

#[test]
fn long_keys_stay_in_budget() {
    let _turn = measuring();
    let array_of_huge_arrays = [9, 0, 0, 0, 9, 0, 0, 0, 255, 0, 0, 0, 0, 0, 0, 0];
    let tails: [(&[u8], &str); 3] = [
        (&[2, 0, 0, 0, 1], "truncated u16"),
        (&[4, 0, 0, 0, 1], "truncated u32"),
        (&array_of_huge_arrays, "array of 255 arrays"),
    ];
    let mut r = Runner::default();
    for key_byte in [b'k', 0x01, 0x10] {
        for (tail, label) in tails {
            let desc = format!("1 MiB key of {key_byte:#04x}, {label}");
            r.case(
                "long_keys",
                desc,
                Expect::Err,
                &long_key_file(key_byte, tail),
            );
        }
    }
    r.finish(&[("long_keys", 9)]);
}

/// SmolLM2's metadata with every array cut to 16 elements, and every tensor cut to one block:
/// the real layout in 25 KiB, a seed the fuzzer can mutate quickly.
fn smol_mini() -> Vec<u8> {
    let gguf = Gguf::open(Model::SmolLm2.path()).unwrap();
    let mut b = GgufBuilder::new();
    for (key, value) in gguf.metadata() {
        let value = match value {
            Value::Array(a) => {
                let head = a.iter().take(16).map(OwnedValue::from).collect();
                OwnedValue::Array(OwnedArray::new(a.element_type(), head).unwrap())
            }
            other => OwnedValue::from(other),
        };
        b.metadata(key, value);
    }
    for t in gguf.tensors() {
        let block = &t.data[..t.ggml_type.block_bytes() as usize];
        b.tensor(t.name, t.ggml_type, &[t.ggml_type.block_size()], block);
    }
    b.to_bytes()
}

#[test]
#[ignore = "writes the fuzz seed corpus; fuzz/seed-corpus.sh runs it"]
fn write_fuzz_seeds() {
    let dir = std::env::var_os("GGUF_FUZZ_SEED_DIR").expect("GGUF_FUZZ_SEED_DIR names the corpus");
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir).unwrap();
    let seeds = [
        ("synthetic.gguf", synthetic_seed().bytes),
        ("smollm2-mini.gguf", smol_mini()),
        (
            "nested-8.gguf",
            GgufBuilder::new().metadata("deep", nested(8)).to_bytes(),
        ),
    ];
    for (name, bytes) in seeds {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}
