//! Tensor infos: read, then validated against the file before any data is touched.

use super::cursor::{Cursor, Span};
use super::error::{PLAUSIBLE_FILE_SIZE, excerpt};
use super::{GgmlType, GgufError};

/// Most dimensions a ggml tensor has (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// Smallest encoding of one tensor info: name length, one dimension, type, offset.
pub(crate) const MIN_TENSOR_INFO_SIZE: u64 = 8 + 4 + 8 + 4 + 8;

/// One tensor's description, positions relative to the file.
#[derive(Debug, Clone)]
pub(crate) struct TensorInfo {
    pub name: Span,
    pub ggml_type: GgmlType,
    pub n_dims: usize,
    pub dims: [u64; MAX_DIMS],
    /// Offset inside the data section, as stored.
    pub offset: u64,
    /// Bytes of data, derived from the type and the dimensions.
    pub size: u64,
}

impl TensorInfo {
    pub fn shape(&self) -> &[u64] {
        &self.dims[..self.n_dims]
    }
}

/// Reads tensor info `index`; checks everything that does not need the data section's position.
pub(crate) fn read_tensor_info(
    cursor: &mut Cursor<'_>,
    index: u64,
) -> Result<TensorInfo, GgufError> {
    let name = cursor.utf8(|| format!("name of tensor #{index}"))?;
    let name_str = std::str::from_utf8(name.of(cursor.bytes())).unwrap_or_default();
    let n_dims = cursor.u32(|| format!("n_dims of tensor {:?}", excerpt(name_str)))?;
    if !(1..=MAX_DIMS as u32).contains(&n_dims) {
        return Err(GgufError::bad_tensor(
            name_str,
            format!("n_dims is {n_dims}, expected 1..={MAX_DIMS}"),
        ));
    }
    let n_dims = n_dims as usize;
    let mut dims = [1u64; MAX_DIMS];
    for (axis, dim) in dims.iter_mut().enumerate().take(n_dims) {
        *dim = cursor.u64(|| format!("dimension {axis} of tensor {:?}", excerpt(name_str)))?;
    }
    let type_id = cursor.u32(|| format!("type of tensor {:?}", excerpt(name_str)))?;
    let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownGgmlType {
        tensor: excerpt(name_str),
        type_id,
    })?;
    let offset = cursor.u64(|| format!("offset of tensor {:?}", excerpt(name_str)))?;
    let size = data_size(name_str, ggml_type, &dims[..n_dims])?;
    Ok(TensorInfo {
        name,
        ggml_type,
        n_dims,
        dims,
        offset,
        size,
    })
}

/// Bytes of a tensor's data, refusing empty, overflowing or block-misaligned shapes.
fn data_size(name: &str, ggml_type: GgmlType, shape: &[u64]) -> Result<u64, GgufError> {
    if let Some(axis) = shape.iter().position(|&d| d == 0) {
        return Err(GgufError::bad_tensor(
            name,
            format!("dimension {axis} is 0 (shape {shape:?})"),
        ));
    }
    let elements = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| {
            GgufError::bad_tensor(name, format!("element count of shape {shape:?} overflows"))
        })?;
    let block = ggml_type.block_size();
    if !shape[0].is_multiple_of(block) {
        return Err(GgufError::bad_tensor(
            name,
            format!(
                "row length {} is not a multiple of the {ggml_type} block size {block}",
                shape[0]
            ),
        ));
    }
    ggml_type.bytes_for(elements).ok_or_else(|| {
        GgufError::bad_tensor(name, format!("byte size of shape {shape:?} overflows"))
    })
}

/// Checks every tensor lies inside the data section, aligned, and that no two overlap.
pub(crate) fn validate_layout(
    bytes: &[u8],
    tensors: &[TensorInfo],
    data_offset: usize,
    alignment: u64,
) -> Result<(), GgufError> {
    let data_len = (bytes.len() as u64).saturating_sub(data_offset as u64);
    let name_of = |t: &TensorInfo| excerpt(&String::from_utf8_lossy(t.name.of(bytes)));
    // Writers pack tensors back to back; a packed layout running past the end of the file is a
    // file cut short (an interrupted download), not one tensor with a lying offset.
    let file_size = bytes.len() as u64;
    if let Some(needed) = packed_end(tensors, alignment)
        .and_then(|end| end.checked_add(data_offset as u64))
        .filter(|&needed| needed > file_size && needed <= PLAUSIBLE_FILE_SIZE)
    {
        return Err(GgufError::Incomplete {
            what: format!("the data of its {} tensors", tensors.len()),
            file_size,
            needed,
        });
    }
    for tensor in tensors {
        if tensor.offset % alignment != 0 {
            return Err(GgufError::bad_tensor(
                &name_of(tensor),
                format!(
                    "offset {} is not a multiple of the alignment {alignment}",
                    tensor.offset
                ),
            ));
        }
        if tensor
            .offset
            .checked_add(tensor.size)
            .is_none_or(|end| end > data_len)
        {
            return Err(GgufError::bad_tensor(
                &name_of(tensor),
                format!(
                    "data [{}, +{}) lies outside the data section of {data_len} bytes (file offset {data_offset})",
                    tensor.offset, tensor.size
                ),
            ));
        }
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        if pair[0].offset + pair[0].size > pair[1].offset {
            return Err(GgufError::OverlappingTensors {
                first: name_of(pair[0]),
                second: name_of(pair[1]),
            });
        }
    }
    Ok(())
}

/// Where the data section must end if the tensors are packed back to back in some order (each
/// starting at the aligned end of the one before, the first at 0), as writers lay them out; `None`
/// for any other layout, and without tensors (no data section is needed).
fn packed_end(tensors: &[TensorInfo], alignment: u64) -> Option<u64> {
    if tensors.is_empty() {
        return None;
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    let mut next = 0u64;
    let mut end = 0u64;
    for tensor in by_offset {
        if tensor.offset != next {
            return None;
        }
        end = tensor.offset.checked_add(tensor.size)?;
        next = end.checked_next_multiple_of(alignment)?;
    }
    Some(end)
}
