//! Errors of the GGUF reader: each names the offset, key or tensor involved.

use std::path::PathBuf;

/// Everything that can go wrong while opening, parsing or querying a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("cannot read GGUF file {path}: {source}")]
    Io {
        /// The path given to `open`.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },

    /// The path names a directory or another non-file (which cannot be mapped).
    #[error("{} is {kind}; --model takes a .gguf file{hint}", path.display())]
    NotAFile {
        /// The path given to `open`.
        path: PathBuf,
        /// `a directory`, or what else it is.
        kind: &'static str,
        /// The `.gguf` files a directory holds, if any, as a suggestion.
        hint: String,
    },

    /// The file ends before the bytes its own header describes: almost always a download or copy
    /// that stopped early. Only reported when the bytes needed are plausible for a real file;
    /// an absurd length or offset stays [`Truncated`](Self::Truncated),
    /// [`CountTooLarge`](Self::CountTooLarge) or [`BadTensor`](Self::BadTensor).
    #[error(
        "GGUF file is incomplete: it has {file_size} bytes but needs at least {needed} for \
         {what}; probably an incomplete download: delete the file and fetch it again"
    )]
    Incomplete {
        /// What runs past the end (a header field, the tensors' data).
        what: String,
        /// Bytes in the file.
        file_size: u64,
        /// Bytes the file must have at least.
        needed: u64,
    },

    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\" (47 47 55 46)")]
    BadMagic {
        /// The four bytes found.
        found: [u8; 4],
    },

    /// The version field is not 3.
    #[error(
        "unsupported GGUF version {version}: only version 3 (little-endian) is supported{hint}"
    )]
    UnsupportedVersion {
        /// The version read (little-endian).
        version: u32,
        /// Extra advice, e.g. for big-endian files.
        hint: &'static str,
    },

    /// The file ended inside a structure.
    #[error(
        "GGUF truncated: {what} at offset {offset} needs {needed} bytes, only {available} left"
    )]
    Truncated {
        /// What was being read.
        what: String,
        /// Byte offset of the read.
        offset: usize,
        /// Bytes the read needs.
        needed: u64,
        /// Bytes left in the file.
        available: usize,
    },

    /// A count cannot possibly fit in the bytes that remain.
    #[error(
        "GGUF claims {count} {what} at offset {offset}, but only {available} bytes remain \
         (each needs at least {min_size})"
    )]
    CountTooLarge {
        /// What is counted (tensors, metadata entries, array elements).
        what: String,
        /// The claimed count.
        count: u64,
        /// Byte offset of the count.
        offset: usize,
        /// Bytes left after the count.
        available: usize,
        /// Smallest encoding of one element.
        min_size: u64,
    },

    /// A key or tensor name is not UTF-8.
    #[error("{what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// What the string is (a key, a tensor name, the value of a key).
        what: String,
        /// Byte offset of the string.
        offset: usize,
    },

    /// A metadata value type id outside 0..=12.
    #[error("metadata key {key:?}: unknown value type id {type_id}")]
    UnknownValueType {
        /// The key whose value has the type.
        key: String,
        /// The raw type id.
        type_id: u32,
    },

    /// Arrays nested deeper than [`MAX_ARRAY_DEPTH`](super::MAX_ARRAY_DEPTH).
    #[error("metadata key {key:?}: arrays nested deeper than {max} levels")]
    NestingTooDeep {
        /// The key holding the array.
        key: String,
        /// The limit.
        max: usize,
    },

    /// The same metadata key appears twice.
    #[error("metadata key {key:?} appears more than once")]
    DuplicateKey {
        /// The repeated key.
        key: String,
    },

    /// `general.alignment` is zero or not a power of two.
    #[error("general.alignment is {value}, expected a non-zero power of two")]
    BadAlignment {
        /// The value found.
        value: u64,
    },

    /// A tensor uses a ggml type id this reader does not know.
    #[error(
        "tensor {tensor:?}: unknown ggml type id {type_id} (llama.cpp b11434 knows 0..=40 minus removed ids)"
    )]
    UnknownGgmlType {
        /// The tensor name.
        tensor: String,
        /// The raw type id.
        type_id: u32,
    },

    /// A tensor info is inconsistent with itself or with the file.
    #[error("tensor {tensor:?}: {problem}")]
    BadTensor {
        /// The tensor name.
        tensor: String,
        /// What is wrong, with the values involved.
        problem: String,
    },

    /// Two tensors name the same bytes.
    #[error("tensors {first:?} and {second:?} overlap in the data section")]
    OverlappingTensors {
        /// The tensor that starts first.
        first: String,
        /// The tensor that starts inside the first.
        second: String,
    },

    /// The same tensor name appears twice.
    #[error("tensor name {name:?} appears more than once")]
    DuplicateTensor {
        /// The repeated name.
        name: String,
    },

    /// A required metadata key is absent.
    #[error("metadata key {key:?} is missing")]
    MissingKey {
        /// The key looked up.
        key: String,
    },

    /// A metadata key holds a value of another type.
    #[error("metadata key {key:?} has type {found}, expected {expected}")]
    WrongType {
        /// The key looked up.
        key: String,
        /// The type the caller asked for.
        expected: &'static str,
        /// The type found in the file.
        found: String,
    },

    /// A metadata integer does not fit the requested type.
    #[error("metadata key {key:?} = {value} does not fit in {target}")]
    OutOfRange {
        /// The key looked up.
        key: String,
        /// The value found.
        value: String,
        /// The requested type.
        target: &'static str,
    },
}

/// Largest file size believed when deciding whether a read past the end means an incomplete
/// file: a real model is smaller than 1 TiB; a larger need comes from a corrupt or hostile value.
pub(crate) const PLAUSIBLE_FILE_SIZE: u64 = 1 << 40;

impl GgufError {
    /// For a read or count past the end that needs the file to have `needed` bytes (`None`: more
    /// than u64 holds): `needed` when it is plausible, so the file is probably
    /// [`Incomplete`](Self::Incomplete); `None` for a corrupt or hostile value.
    pub(crate) fn plausible_end(needed: Option<u64>) -> Option<u64> {
        needed.filter(|&needed| needed <= PLAUSIBLE_FILE_SIZE)
    }

    pub(crate) fn bad_tensor(tensor: &str, problem: impl Into<String>) -> Self {
        Self::BadTensor {
            tensor: excerpt(tensor),
            problem: problem.into(),
        }
    }
}

/// Longest key or tensor name quoted in full by an error.
const EXCERPT_CHARS: usize = 96;

/// A key or name as errors quote it: cut to [`EXCERPT_CHARS`] characters, so a hostile
/// megabyte-long key cannot make an error message many times larger than the file.
pub(crate) fn excerpt(text: &str) -> String {
    match text.char_indices().nth(EXCERPT_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}
