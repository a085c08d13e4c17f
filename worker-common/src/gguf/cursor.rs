//! A bounds-checked little-endian reader over the file bytes: every read is checked against
//! what is left, so no offset from the file is trusted.

use super::GgufError;

/// A position inside the file's bytes.
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

/// A byte range of the file (start offset and length), used instead of references so that the
/// parsed index can live beside the mapping it describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub start: usize,
    pub len: usize,
}

impl Span {
    pub fn of<'a>(&self, bytes: &'a [u8]) -> &'a [u8] {
        bytes
            .get(self.start..self.start.saturating_add(self.len))
            .unwrap_or_default()
    }
}

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.pos)
    }

    /// Takes `len` bytes; `what` names the structure for the error and is only built on failure.
    pub fn take(&mut self, len: u64, what: impl FnOnce() -> String) -> Result<Span, GgufError> {
        let available = self.remaining();
        match usize::try_from(len) {
            Ok(n) if n <= available => {
                let span = Span {
                    start: self.pos,
                    len: n,
                };
                self.pos += n;
                Ok(span)
            }
            _ => Err(
                match GgufError::plausible_end((self.pos as u64).checked_add(len)) {
                    Some(needed) => GgufError::Incomplete {
                        what: what(),
                        file_size: self.bytes.len() as u64,
                        needed,
                    },
                    None => GgufError::Truncated {
                        what: what(),
                        offset: self.pos,
                        needed: len,
                        available,
                    },
                },
            ),
        }
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let span = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(span.of(self.bytes));
        Ok(out)
    }

    pub fn u8(&mut self, what: impl FnOnce() -> String) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub fn u16(&mut self, what: impl FnOnce() -> String) -> Result<u16, GgufError> {
        self.array(what).map(u16::from_le_bytes)
    }

    pub fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A GGUF string: a u64 length, then that many bytes (not checked for UTF-8 here).
    pub fn string(&mut self, what: impl Fn() -> String) -> Result<Span, GgufError> {
        let len = self.u64(|| format!("length of {}", what()))?;
        self.take(len, what)
    }

    /// A GGUF string that must be UTF-8 (keys, tensor names).
    pub fn utf8(&mut self, what: impl Fn() -> String) -> Result<Span, GgufError> {
        let span = self.string(&what)?;
        match std::str::from_utf8(span.of(self.bytes)) {
            Ok(_) => Ok(span),
            Err(_) => Err(GgufError::InvalidUtf8 {
                what: what(),
                offset: span.start,
            }),
        }
    }

    /// Reads a count and refuses it unless `count × min_size` bytes could still follow.
    ///
    /// `what` is only built on failure: nested arrays call this once per element, and building
    /// a name that quotes the key each time made parsing quadratic in the key length.
    pub fn count(&mut self, what: impl Fn() -> String, min_size: u64) -> Result<u64, GgufError> {
        let offset = self.pos;
        let count = self.u64(|| format!("count of {}", what()))?;
        let available = self.remaining();
        let need = count.checked_mul(min_size);
        if need.is_none_or(|need| need > available as u64) {
            let needed = need.and_then(|need| need.checked_add(self.pos as u64));
            return Err(match GgufError::plausible_end(needed) {
                Some(needed) => GgufError::Incomplete {
                    what: format!("{count} {} at offset {offset}", what()),
                    file_size: self.bytes.len() as u64,
                    needed,
                },
                None => GgufError::CountTooLarge {
                    what: what(),
                    count,
                    offset,
                    available,
                    min_size,
                },
            });
        }
        Ok(count)
    }
}
