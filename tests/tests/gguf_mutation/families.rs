//! The mutation families, each turning a seed into cases for the `Runner`, and the helpers
//! they share.

use std::collections::BTreeSet;

use llorch_tests::gguf_writer::{GgufBuilder, OwnedValue, value_type_id};
use worker_common::gguf::{ALIGNMENT_KEY, GgmlType, MAX_ARRAY_DEPTH, ValueType};

use crate::fields::{Field, Kind};
use crate::runner::{Expect, Runner};
use crate::seeds::{Seed, nested, synthetic_builder};

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
pub(crate) fn seeds(r: &mut Runner, seeds: &[Seed]) {
    for seed in seeds {
        let expect = if seed.valid { Expect::Ok } else { Expect::Err };
        r.case("seeds", seed.name.to_owned(), expect, &seed.bytes);
    }
}

/// Cuts at every field boundary (sampled in the SmolLM2 prefix) and at other offsets; a file cut
/// before its last tensor's data ends must be refused.
pub(crate) fn truncate(r: &mut Runner, seed: &Seed) {
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
pub(crate) fn flip(r: &mut Runner, seed: &Seed) {
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
pub(crate) fn huge(r: &mut Runner, seed: &Seed) {
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
pub(crate) fn dense_metadata(r: &mut Runner) {
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
pub(crate) fn type_ids(r: &mut Runner, seed: &Seed) {
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
pub(crate) fn n_dims(r: &mut Runner, seed: &Seed) {
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
pub(crate) fn tensor_offsets(r: &mut Runner, seed: &Seed) {
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
pub(crate) fn alignment(r: &mut Runner, seed: &Seed) {
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
pub(crate) fn duplicates(r: &mut Runner, seed: &Seed) {
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
pub(crate) fn nesting(r: &mut Runner) {
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

pub(crate) const RANDOM_CASES: usize = 2000;

/// Cases of one to four random edits each, three quarters on the synthetic seed.
pub(crate) fn random(r: &mut Runner, seeds: &[Seed]) {
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
