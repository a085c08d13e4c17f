//! A zero-copy GGUF v3 (and v2) reader.
//!
//! [`Gguf::open`] maps the file and parses its header, metadata and tensor infos once, checking
//! every count, length and offset against the bytes that exist before using it. Metadata strings,
//! arrays and tensor data are then borrowed from the mapping, never copied.
//!
//! Layout (little-endian): magic `GGUF`, version u32, tensor count u64, metadata count u64, the
//! metadata entries, the tensor infos, padding to `general.alignment` (default 32), tensor data.

mod cursor;
mod error;
mod ggml_type;
mod metadata;
mod tensor;
mod value;

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

pub use error::GgufError;
pub use ggml_type::{GgmlType, file_type_label};
pub use metadata::FromValue;
pub use tensor::MAX_DIMS;
pub use value::{ArrayIter, ArrayValue, MAX_ARRAY_DEPTH, Value, ValueType};

use cursor::{Cursor, Span};
use error::excerpt;
use tensor::{MIN_TENSOR_INFO_SIZE, TensorInfo};
use value::RawValue;

/// The GGUF version written by current llama.cpp, and the newest read.
pub const GGUF_VERSION: u32 = 3;
/// The oldest version read: v2 has v3's layout (v3 only added big-endian files), and llama.cpp's
/// own vocab test files still include v2 files.
pub const GGUF_OLDEST_VERSION: u32 = 2;
/// Data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that overrides the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Smallest encoding of one metadata entry: key length, type, a one-byte value.
const MIN_METADATA_ENTRY_SIZE: u64 = 8 + 4 + 1;

/// A parsed GGUF file over its bytes `B` (a memory mapping, or any byte buffer).
pub struct Gguf<B = Mmap> {
    bytes: B,
    metadata: Vec<(Span, RawValue)>,
    /// Indices into `metadata`, sorted by key, for lookups.
    metadata_by_key: Vec<usize>,
    tensors: Vec<TensorInfo>,
    /// Indices into `tensors`, sorted by name, for lookups.
    tensors_by_name: Vec<usize>,
    alignment: u64,
    data_offset: usize,
}

/// One tensor: its description and its data, borrowed from the file.
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'a> {
    /// The tensor's name, e.g. `blk.0.attn_q.weight`.
    pub name: &'a str,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Dimensions in ggml order: `shape[0]` is the row length (contiguous).
    pub shape: &'a [u64],
    /// Offset of the data inside the data section, as stored in the file.
    pub offset: u64,
    /// The tensor's bytes in its on-disk block format.
    pub data: &'a [u8],
}

impl Tensor<'_> {
    /// Number of elements.
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

impl Gguf<Mmap> {
    /// Maps and parses the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io_error = |source| GgufError::Io {
            path: path.to_owned(),
            source,
        };
        // Looked at before opening: opening a FIFO blocks until a writer comes (the load would
        // hang), and mapping a directory fails with ENODEV ("No such device"); say what is wrong.
        let file_type = std::fs::metadata(path).map_err(io_error)?.file_type();
        if !file_type.is_file() {
            return Err(not_a_file(path, file_type.is_dir()));
        }
        let file = File::open(path).map_err(io_error)?;
        // The path could have been replaced between the two calls: check what was opened too.
        let file_type = file.metadata().map_err(io_error)?.file_type();
        if !file_type.is_file() {
            return Err(not_a_file(path, file_type.is_dir()));
        }
        // SAFETY: the mapping is read-only. Another process truncating or rewriting the model file
        // while the worker runs is outside what any mmap-based loader (llama.cpp included) defends
        // against; the worker's model files are immutable by operation.
        let mapping = unsafe { Mmap::map(&file) }.map_err(io_error)?;
        Self::parse(mapping)
    }

    /// Drops the pages of `range` (byte offsets into the file) from this process's resident
    /// memory, for a backend that copied those tensors out (repacked them). Reading the range
    /// again maps the same file pages back in.
    #[cfg(unix)]
    pub fn release(&self, range: std::ops::Range<usize>) -> std::io::Result<()> {
        let len = range.end.saturating_sub(range.start);
        // SAFETY: the mapping is read-only and backed by the file: MADV_DONTNEED drops only
        // page-table entries, and the next read faults the unchanged file contents back in.
        unsafe {
            self.bytes
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, range.start, len)
        }
    }
}

impl<B: AsRef<[u8]>> Gguf<B> {
    /// Parses and validates `bytes` as a GGUF v3 file.
    pub fn parse(bytes: B) -> Result<Self, GgufError> {
        let data = bytes.as_ref();
        let mut cursor = Cursor::new(data);
        read_preamble(&mut cursor)?;
        let tensor_count = cursor.count(|| "tensors".to_owned(), MIN_TENSOR_INFO_SIZE)?;
        let metadata_count =
            cursor.count(|| "metadata entries".to_owned(), MIN_METADATA_ENTRY_SIZE)?;

        let metadata = read_metadata(&mut cursor, metadata_count)?;
        let metadata_by_key = sorted_unique(
            &metadata,
            |(key, _)| key.of(data),
            |key| GgufError::DuplicateKey {
                key: excerpt(&String::from_utf8_lossy(key)),
            },
        )?;
        let mut tensors = Vec::with_capacity(tensor_count as usize);
        for index in 0..tensor_count {
            tensors.push(tensor::read_tensor_info(&mut cursor, index)?);
        }
        let tensors_by_name = sorted_unique(
            &tensors,
            |t| t.name.of(data),
            |name| GgufError::DuplicateTensor {
                name: excerpt(&String::from_utf8_lossy(name)),
            },
        )?;

        let header_end = cursor.pos() as u64;
        let mut gguf = Self {
            bytes,
            metadata,
            metadata_by_key,
            tensors,
            tensors_by_name,
            alignment: DEFAULT_ALIGNMENT,
            data_offset: 0,
        };
        gguf.alignment = gguf.read_alignment()?;
        let data_offset = header_end.next_multiple_of(gguf.alignment);
        gguf.data_offset = usize::try_from(data_offset).unwrap_or(usize::MAX);
        tensor::validate_layout(
            gguf.bytes.as_ref(),
            &gguf.tensors,
            gguf.data_offset,
            gguf.alignment,
        )?;
        Ok(gguf)
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_ref()
    }

    /// Data alignment in bytes.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// File offset of the data section (tensor offsets are relative to it).
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// Number of metadata entries.
    pub fn metadata_len(&self) -> usize {
        self.metadata.len()
    }

    /// Metadata entries in file order.
    pub fn metadata(&self) -> impl ExactSizeIterator<Item = (&str, Value<'_>)> {
        let bytes = self.bytes.as_ref();
        self.metadata
            .iter()
            .map(move |(key, raw)| (utf8(key.of(bytes)), raw.resolve(bytes)))
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<Value<'_>> {
        let bytes = self.bytes.as_ref();
        let found = self
            .metadata_by_key
            .binary_search_by(|&i| self.metadata[i].0.of(bytes).cmp(key.as_bytes()))
            .ok()?;
        let (_, raw) = self.metadata[self.metadata_by_key[found]];
        Some(raw.resolve(bytes))
    }

    /// Number of tensors.
    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    /// Tensors in file order.
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = Tensor<'_>> {
        self.tensors.iter().map(|info| self.tensor_at(info))
    }

    /// The tensor called `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<Tensor<'_>> {
        let bytes = self.bytes.as_ref();
        let found = self
            .tensors_by_name
            .binary_search_by(|&i| self.tensors[i].name.of(bytes).cmp(name.as_bytes()))
            .ok()?;
        Some(self.tensor_at(&self.tensors[self.tensors_by_name[found]]))
    }

    fn tensor_at<'a>(&'a self, info: &'a TensorInfo) -> Tensor<'a> {
        let bytes = self.bytes.as_ref();
        // Validated at parse time: the range lies inside the file.
        let start = self.data_offset + info.offset as usize;
        let data = bytes
            .get(start..start + info.size as usize)
            .unwrap_or_default();
        Tensor {
            name: utf8(info.name.of(bytes)),
            ggml_type: info.ggml_type,
            shape: info.shape(),
            offset: info.offset,
            data,
        }
    }

    fn read_alignment(&self) -> Result<u64, GgufError> {
        let Some(alignment) = self.optional::<u32>(ALIGNMENT_KEY)? else {
            return Ok(DEFAULT_ALIGNMENT);
        };
        let alignment = u64::from(alignment);
        if !alignment.is_power_of_two() {
            return Err(GgufError::BadAlignment { value: alignment });
        }
        Ok(alignment)
    }
}

/// The error for a path that is not a regular file; for a directory, its `.gguf` files are
/// suggested (the first few, sorted).
fn not_a_file(path: &Path, is_dir: bool) -> GgufError {
    const SHOWN: usize = 3;
    if !is_dir {
        return GgufError::NotAFile {
            path: path.to_owned(),
            kind: "not a regular file",
            hint: String::new(),
        };
    }
    let mut names: Vec<String> = std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".gguf"))
        .collect();
    names.sort();
    let hint = match names.len() {
        0 => String::new(),
        n => {
            let more = if n > SHOWN { ", …" } else { "" };
            let shown = names[..n.min(SHOWN)].join(", ");
            format!(" (it holds {shown}{more})")
        }
    };
    GgufError::NotAFile {
        path: path.to_owned(),
        kind: "a directory",
        hint,
    }
}

fn read_preamble(cursor: &mut Cursor<'_>) -> Result<(), GgufError> {
    let magic = cursor.take(4, || "magic".to_owned())?.of(cursor.bytes());
    if magic != b"GGUF" {
        let mut found = [0u8; 4];
        found.copy_from_slice(magic);
        return Err(GgufError::BadMagic { found });
    }
    let version = cursor.u32(|| "version".to_owned())?;
    if !(GGUF_OLDEST_VERSION..=GGUF_VERSION).contains(&version) {
        let hint = if version.swap_bytes() <= GGUF_VERSION {
            " (this looks like a big-endian GGUF file)"
        } else {
            ""
        };
        return Err(GgufError::UnsupportedVersion { version, hint });
    }
    Ok(())
}

fn read_metadata(cursor: &mut Cursor<'_>, count: u64) -> Result<Vec<(Span, RawValue)>, GgufError> {
    let mut entries = Vec::with_capacity(count as usize);
    for index in 0..count {
        let key_span = cursor.utf8(|| format!("key of metadata entry #{index}"))?;
        let key = utf8(key_span.of(cursor.bytes()));
        let type_id = cursor.u32(|| format!("value type of metadata key {:?}", excerpt(key)))?;
        let value_type =
            ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
                key: excerpt(key),
                type_id,
            })?;
        let value = value::read_value(cursor, value_type, key, MAX_ARRAY_DEPTH)?;
        entries.push((key_span, value));
    }
    Ok(entries)
}

/// Indices of `items` sorted by `key`; a repeated key is an error built by `duplicate`.
fn sorted_unique<'a, T>(
    items: &[T],
    key: impl Fn(&T) -> &'a [u8],
    duplicate: impl Fn(&[u8]) -> GgufError,
) -> Result<Vec<usize>, GgufError> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_unstable_by(|&a, &b| key(&items[a]).cmp(key(&items[b])));
    for pair in order.windows(2) {
        let first = key(&items[pair[0]]);
        if first == key(&items[pair[1]]) {
            return Err(duplicate(first));
        }
    }
    Ok(order)
}

/// Keys and names were checked to be UTF-8 while parsing.
fn utf8(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(version: u32, tensors: u64, metadata: u64) -> Vec<u8> {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend_from_slice(&version.to_le_bytes());
        bytes.extend_from_slice(&tensors.to_le_bytes());
        bytes.extend_from_slice(&metadata.to_le_bytes());
        bytes
    }

    #[test]
    fn an_empty_file_parses() {
        let gguf = Gguf::parse(header(3, 0, 0)).unwrap();
        assert_eq!(
            (gguf.tensor_count(), gguf.metadata_len(), gguf.alignment()),
            (0, 0, 32)
        );
    }

    #[test]
    fn a_huge_tensor_count_fails_before_allocating() {
        // 16 bytes: magic, version, and a tensor count of 2^60 with nothing after it.
        let bytes = &header(3, 1 << 60, 0)[..16];
        let err = Gguf::parse(bytes).err().unwrap();
        assert!(
            matches!(err, GgufError::CountTooLarge { count, .. } if count == 1 << 60),
            "{err}"
        );
    }

    #[test]
    fn wrong_magic_and_versions_are_named() {
        let err = Gguf::parse(&b"GGML\x03\0\0\0"[..]).err().unwrap();
        assert!(err.to_string().contains("not a GGUF file"), "{err}");
        let err = Gguf::parse(header(1, 0, 0)).err().unwrap();
        assert!(
            err.to_string().contains("unsupported GGUF version 1"),
            "{err}"
        );
        assert!(Gguf::parse(header(2, 0, 0)).is_ok(), "v2 has v3's layout");
        let err = Gguf::parse(header(3u32.swap_bytes(), 0, 0)).err().unwrap();
        assert!(err.to_string().contains("big-endian"), "{err}");
    }

    /// A file with two packed F32 tensors of 8 elements (32 bytes each) and a metadata string;
    /// `second_offset` is where the second tensor says its data starts (32 when packed).
    fn two_tensor_file(second_offset: u64) -> Vec<u8> {
        let mut bytes = header(3, 2, 1);
        bytes.extend_from_slice(&5u64.to_le_bytes());
        bytes.extend_from_slice(b"a.key");
        bytes.extend_from_slice(&8u32.to_le_bytes()); // string
        bytes.extend_from_slice(&2u64.to_le_bytes());
        bytes.extend_from_slice(b"hi");
        for (name, offset) in [(b"t0", 0u64), (b"t1", second_offset)] {
            bytes.extend_from_slice(&2u64.to_le_bytes());
            bytes.extend_from_slice(name);
            bytes.extend_from_slice(&1u32.to_le_bytes()); // n_dims
            bytes.extend_from_slice(&8u64.to_le_bytes()); // shape [8]
            bytes.extend_from_slice(&0u32.to_le_bytes()); // F32
            bytes.extend_from_slice(&offset.to_le_bytes());
        }
        bytes.resize(bytes.len().next_multiple_of(32), 0);
        bytes.extend_from_slice(&[0x3f; 64]);
        bytes
    }

    #[test]
    fn a_truncated_download_is_named_as_such() {
        let full = two_tensor_file(32);
        assert_eq!(Gguf::parse(full.clone()).unwrap().tensor_count(), 2);
        // Cut inside the data, inside the tensor infos, inside the metadata string, at 0 bytes.
        for cut in [full.len() - 1, full.len() - 40, 80, 42, 0] {
            let err = Gguf::parse(&full[..cut]).err().unwrap();
            let GgufError::Incomplete {
                file_size, needed, ..
            } = err
            else {
                panic!("cut at {cut}: {err}");
            };
            assert_eq!(file_size, cut as u64, "{err}");
            assert!(needed > file_size, "{err}");
            let message = err.to_string();
            assert!(
                message.contains(&format!("it has {cut} bytes but needs at least {needed}"))
                    && message.contains("probably an incomplete download: delete the file"),
                "{message}"
            );
        }
        let err = Gguf::parse(&full[..full.len() - 1]).err().unwrap();
        assert!(
            err.to_string().contains(&format!(
                "needs at least {} for the data of its 2 tensors;",
                full.len()
            )),
            "{err}"
        );
    }

    #[test]
    fn a_lying_offset_or_length_is_not_called_a_truncated_download() {
        // The second tensor's data is claimed far away (aligned, no overlap): a corrupt header.
        let err = Gguf::parse(two_tensor_file(1 << 20)).err().unwrap();
        assert!(matches!(err, GgufError::BadTensor { .. }), "{err}");
        assert!(
            err.to_string().contains("outside the data section"),
            "{err}"
        );
        // A key length of 2^60 bytes.
        let mut bytes = header(3, 0, 1);
        bytes.extend_from_slice(&(1u64 << 60).to_le_bytes());
        bytes.extend_from_slice(b"a.key");
        let err = Gguf::parse(bytes).err().unwrap();
        assert!(matches!(err, GgufError::Truncated { .. }), "{err}");
    }

    #[test]
    fn a_directory_is_named_as_a_directory() {
        let dir = std::env::temp_dir().join(format!("llorch-gguf-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("b.gguf"), two_tensor_file(32)).unwrap();
        std::fs::write(dir.join("a.gguf"), two_tensor_file(32)).unwrap();
        std::fs::write(dir.join("notes.txt"), b"").unwrap();
        let err = Gguf::open(&dir).err().unwrap();
        let message = err.to_string();
        assert!(Gguf::open(dir.join("a.gguf")).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(err, GgufError::NotAFile { .. }), "{message}");
        assert_eq!(
            message,
            format!(
                "{} is a directory; --model takes a .gguf file (it holds a.gguf, b.gguf)",
                dir.display()
            )
        );
    }

    #[test]
    #[cfg(unix)]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let fifo = std::env::temp_dir().join(format!("llorch-gguf-fifo-{}", std::process::id()));
        let _ = std::fs::remove_file(&fifo);
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(status.success(), "mkfifo");
        // Opened for reading, a FIFO blocks until a writer opens it: a regression would hang
        // here, so the open runs on a thread given 10 s, after which a writer releases it.
        let (sender, receiver) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || sender.send(Gguf::open(&path).err()));
        let outcome = receiver.recv_timeout(std::time::Duration::from_secs(10));
        if outcome.is_err() {
            let _writer = std::fs::OpenOptions::new().write(true).open(&fifo);
            std::fs::remove_file(&fifo).unwrap();
            panic!("Gguf::open waited on the FIFO for a writer");
        }
        std::fs::remove_file(&fifo).unwrap();
        let err = outcome.unwrap().unwrap();
        assert!(matches!(err, GgufError::NotAFile { .. }), "{err}");
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    #[test]
    fn typed_getters_name_the_key_and_both_types() {
        let mut bytes = header(3, 0, 1);
        bytes.extend_from_slice(&5u64.to_le_bytes());
        bytes.extend_from_slice(b"a.key");
        bytes.extend_from_slice(&8u32.to_le_bytes()); // string
        bytes.extend_from_slice(&2u64.to_le_bytes());
        bytes.extend_from_slice(b"hi");
        let gguf = Gguf::parse(bytes).unwrap();
        assert_eq!(gguf.require::<&str>("a.key").unwrap(), "hi");
        let err = gguf.require::<u32>("a.key").unwrap_err();
        assert_eq!(
            err.to_string(),
            "metadata key \"a.key\" has type string, expected u32"
        );
        let err = gguf.require::<u32>("b.key").unwrap_err();
        assert_eq!(err.to_string(), "metadata key \"b.key\" is missing");
        assert_eq!(gguf.optional::<u32>("b.key").unwrap(), None);
    }
}
