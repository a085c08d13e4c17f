//! The field map of a valid file: where every field of its header, metadata and tensor infos
//! lies, so that mutation families can target fields by kind and position.

use worker_common::gguf::{ALIGNMENT_KEY, ValueType};

/// What a field of a GGUF file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
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
pub(crate) struct Field {
    pub(crate) kind: Kind,
    pub(crate) start: usize,
    pub(crate) len: usize,
    pub(crate) depth: usize,
}

impl Field {
    pub(crate) fn end(&self) -> usize {
        self.start + self.len
    }
}

/// The fields of a valid file's header, metadata and tensor infos, in file order.
pub(crate) struct FieldMap {
    pub(crate) fields: Vec<Field>,
    /// Start of the u32 value of `general.alignment`, when the file has one.
    pub(crate) alignment_value: Option<usize>,
}

impl FieldMap {
    pub(crate) fn of(&self, kind: Kind) -> impl Iterator<Item = Field> + '_ {
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
pub(crate) fn walk(bytes: &[u8], data_offset: usize) -> FieldMap {
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
