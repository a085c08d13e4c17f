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

mod families;
mod fields;
mod heap;
mod runner;
mod seeds;

use llorch_tests::assets::Model;
use llorch_tests::gguf_writer::{GgufBuilder, OwnedArray, OwnedValue};
use worker_common::gguf::{Gguf, GgufError, Value};

use families::{
    RANDOM_CASES, alignment, dense_metadata, duplicates, flip, huge, n_dims, nesting, random,
    seeds, tensor_offsets, truncate, type_ids,
};
use heap::{CountingAllocator, measure, measuring};
use runner::{Expect, Runner};
use seeds::{nested, smol_seed, synthetic_seed};

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
pub(crate) const HEAP_FACTOR: usize = 8;
pub(crate) const HEAP_SLACK: usize = 64 * 1024;

/// Seeds up to this length are mutated at every field and byte.
pub(crate) const EXHAUSTIVE_MAX_LEN: usize = 64 * 1024;

/// Bytes of tensor data kept after the header of the SmolLM2 prefix.
pub(crate) const SMOL_DATA_KEPT: usize = 4096;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

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
