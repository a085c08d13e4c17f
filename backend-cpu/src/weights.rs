//! The model's tensors as the forward pass reads them: matrices are byte ranges of the file
//! mapping, those with a packed kernel also repacked once ([`pack`]); small vectors (norms,
//! biases) are copied out as f32. Which tensor is which
//! comes from worker-common's [`worker_common::model::Weights`]; this file only says how the CPU
//! holds one.

use std::ops::Range;
use std::sync::Arc;

use worker_common::backend::BackendError;
use worker_common::gguf::{GgmlType, Gguf};
use worker_common::model::{self, MatrixTensor, ModelSpec, TensorSource, VectorTensor};

use crate::kernels::formats::{Iq4Xs, Q2K, Q3K, Q4K, Q6K};
use crate::kernels::{
    Arena, GROUP, KLayout, Legacy, PackedIq4Xs, PackedK, PackedQ2K, PackedQ3K, PackedQ6K,
    PackedRows, packed_k_available,
};
use crate::quant;
use crate::team::Team;

/// A weight matrix of `rows` rows of `cols` elements, stored row-major in its GGUF block
/// format inside the mapping.
#[derive(Debug, Clone)]
pub struct Matrix {
    /// Tensor name, for error messages.
    pub name: String,
    /// Block format of the rows.
    pub ggml_type: GgmlType,
    /// Output features (ggml's `ne[1]`).
    pub rows: usize,
    /// Input features (ggml's `ne[0]`), a whole number of blocks.
    pub cols: usize,
    /// Bytes per row.
    pub row_bytes: usize,
    /// Byte range of the data in the file (empty for a [`copy`](Self::copy)).
    pub range: Range<usize>,
    /// The rows in memory of our own when they are not in the file as the kernels read them
    /// (MXFP4 rewritten as Q8_0 at load); dropped once [`pack`] has repacked them.
    pub copy: Option<Arc<[u8]>>,
    /// The rows repacked for the SIMD kernels ([`pack`]); the matmul reads these instead of
    /// the file.
    pub packed: Option<Arc<Packed>>,
}

/// A matrix's rows in a kernel's interleaved layout.
#[derive(Debug)]
pub enum Packed {
    /// A 32-element block format.
    Legacy(PackedRows),
    /// Q4_K.
    KQuant(PackedK),
    /// Q6_K.
    Q6K(PackedQ6K),
    /// Q3_K.
    Q3K(PackedQ3K),
    /// Q2_K.
    Q2K(PackedQ2K),
    /// IQ4_XS.
    Iq4Xs(PackedIq4Xs),
}

impl Packed {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            Packed::Legacy(p) => p.bytes(),
            Packed::KQuant(p) => p.bytes(),
            Packed::Q6K(p) => p.bytes(),
            Packed::Q3K(p) => p.bytes(),
            Packed::Q2K(p) => p.bytes(),
            Packed::Iq4Xs(p) => p.bytes(),
        }
    }

    /// `raw` (`rows` rows of `ggml_type`) repacked, if a packed kernel takes that format on
    /// this CPU.
    fn of(
        arena: &Arc<Arena>,
        ggml_type: GgmlType,
        raw: &[u8],
        rows: usize,
    ) -> Option<Result<Self, String>> {
        if let Some(format) = Legacy::of(ggml_type) {
            return Some(
                PackedRows::pack_in(Some(arena), format, raw, rows)
                    .map(Packed::Legacy)
                    .map_err(|e| e.to_string()),
            );
        }
        if !packed_k_available() {
            return None;
        }
        let bad = || format!("{} bytes are not {rows} rows of {ggml_type}", raw.len());
        // Q5_K keeps the GGUF layout: no model at hand has enough of it to be worth a kernel.
        match ggml_type {
            GgmlType::Q4_K => Some(
                PackedK::pack_in(Some(arena), raw, rows)
                    .map(Packed::KQuant)
                    .ok_or_else(bad),
            ),
            GgmlType::Q6_K => Some(
                PackedQ6K::pack_in(Some(arena), raw, rows)
                    .map(Packed::Q6K)
                    .ok_or_else(bad),
            ),
            GgmlType::Q3_K => Some(
                PackedQ3K::pack_in(Some(arena), raw, rows)
                    .map(Packed::Q3K)
                    .ok_or_else(bad),
            ),
            GgmlType::Q2_K => Some(
                PackedQ2K::pack_in(Some(arena), raw, rows)
                    .map(Packed::Q2K)
                    .ok_or_else(bad),
            ),
            GgmlType::IQ4_XS => Some(
                PackedIq4Xs::pack_in(Some(arena), raw, rows)
                    .map(Packed::Iq4Xs)
                    .ok_or_else(bad),
            ),
            _ => None,
        }
    }
}

impl Matrix {
    /// Bytes of the whole matrix, in its block format.
    pub fn bytes(&self) -> usize {
        self.rows * self.row_bytes
    }

    /// The rows in their block format: the copy, else the range of the mapping `file`;
    /// `None` when neither holds them (a repacked copy, whose rows only the packing has).
    pub fn rows_data<'a>(&'a self, file: &'a [u8]) -> Option<&'a [u8]> {
        match &self.copy {
            Some(copy) => Some(copy),
            None => file
                .get(self.range.clone())
                .filter(|data| data.len() == self.bytes()),
        }
    }
}

/// Every tensor of the model: matrices in the mapping, vectors as f32.
pub type Weights = model::Weights<Matrix, Vec<f32>>;
/// The tensors of one block.
pub type Layer = model::Layer<Matrix, Vec<f32>>;

/// Hands out ranges of the mapping `file` and dequantized vectors.
struct Mapping<'a> {
    file: &'a [u8],
}

impl TensorSource for Mapping<'_> {
    const BACKEND: &'static str = "cpu";
    type Matrix = Matrix;
    type Vector = Vec<f32>;

    fn matrix(&mut self, tensor: MatrixTensor<'_>) -> Result<Matrix, BackendError> {
        let name = tensor.name;
        if !crate::kernels::supports(tensor.ggml_type) {
            return Err(BackendError::Unsupported {
                backend: Self::BACKEND,
                what: format!("{name}: matrix type {}", tensor.ggml_type),
            });
        }
        // The reader hands out slices of the mapping; their position is the byte range. Rows
        // from elsewhere (rewritten at load) are copied.
        let start = (tensor.data.as_ptr() as usize)
            .checked_sub(self.file.as_ptr() as usize)
            .filter(|start| start + tensor.data.len() <= self.file.len());
        let (range, copy) = match start {
            Some(start) => (start..start + tensor.data.len(), None),
            None => (0..0, Some(Arc::from(tensor.data))),
        };
        Ok(Matrix {
            name: name.to_owned(),
            ggml_type: tensor.ggml_type,
            rows: tensor.rows,
            cols: tensor.cols,
            row_bytes: tensor.row_bytes,
            range,
            copy,
            packed: None,
        })
    }

    fn vector(&mut self, tensor: VectorTensor<'_>) -> Result<Vec<f32>, BackendError> {
        let mut out = vec![0.0; tensor.len];
        quant::dequantize(tensor.ggml_type, tensor.data, &mut out)
            .map_err(|e| BackendError::InvalidModel(format!("{}: {e}", tensor.name)))?;
        Ok(out)
    }
}

/// Collects the tensors `spec` describes from the mapped `gguf`.
pub fn from_file(gguf: &Gguf, spec: &ModelSpec) -> Result<Weights, BackendError> {
    Weights::assemble(gguf, spec, &mut Mapping { file: gguf.bytes() })
}

/// Every matrix the matmul reads: the blocks' projections and the head (not the embeddings,
/// which are looked up row by row).
fn matmul_matrices(weights: &mut Weights) -> Vec<&mut Matrix> {
    let mut matrices = vec![&mut weights.output];
    for layer in &mut weights.layers {
        matrices.extend(layer.matrices_mut());
    }
    matrices
}

/// Bytes of `rows` rows of `row_bytes` of `ggml_type` in their packed layout (whole groups of
/// [`GROUP`] rows); 0 for the formats that are not repacked.
fn packed_len(ggml_type: GgmlType, rows: usize, row_bytes: usize) -> usize {
    let (block_bytes, group_bytes) = match (Legacy::of(ggml_type), ggml_type) {
        (Some(format), _) => (format.block_bytes(), GROUP * format.block_bytes()),
        (None, GgmlType::Q4_K) => (Q4K::BLOCK_BYTES, Q4K::GROUP_BYTES),
        (None, GgmlType::Q6_K) => (Q6K::BLOCK_BYTES, Q6K::GROUP_BYTES),
        (None, GgmlType::Q3_K) => (Q3K::BLOCK_BYTES, Q3K::GROUP_BYTES),
        (None, GgmlType::Q2_K) => (Q2K::BLOCK_BYTES, Q2K::GROUP_BYTES),
        (None, GgmlType::IQ4_XS) => (Iq4Xs::BLOCK_BYTES, Iq4Xs::GROUP_BYTES),
        _ => return 0,
    };
    rows.div_ceil(GROUP) * (row_bytes / block_bytes) * group_bytes
}

/// Repacks every matmul matrix whose format has a packed kernel on this CPU (the 32-element
/// formats with IQ4_NL, Q2_K, Q3_K, Q4_K, Q6_K and IQ4_XS: `kernels::packed`, `kernels::packed_k`) into one arena, a matrix per
/// task of `team`; returns the file ranges no longer read, whose pages the caller may release.
pub fn pack(
    team: &Team,
    weights: &mut Weights,
    file: &[u8],
) -> Result<Vec<Range<usize>>, BackendError> {
    let matrices = matmul_matrices(weights);
    // Every matrix in one arena (`kernels::arena`, huge pages), reserved for what the packed
    // layouts take (Q4_K's is larger than its GGUF rows), each region rounded to 64 bytes.
    let reserve: usize = matrices
        .iter()
        .map(|m| packed_len(m.ggml_type, m.rows, m.row_bytes) + 64)
        .sum();
    let arena = Arena::new(reserve).ok_or(BackendError::OutOfMemory {
        what: "repacked weights",
        bytes: reserve as u64,
    })?;
    let mut jobs: Vec<_> = matrices.into_iter().map(|m| (m, Ok(None))).collect();
    team.for_each(&mut jobs, |(m, released)| {
        *released = pack_one(&arena, m, file)
    });
    jobs.into_iter()
        .filter_map(|(_, released)| released.transpose())
        .collect()
}

/// Repacks `m` into `arena` if its format has a packed kernel; the file range it no longer
/// reads.
fn pack_one(
    arena: &Arc<Arena>,
    m: &mut Matrix,
    file: &[u8],
) -> Result<Option<Range<usize>>, BackendError> {
    let raw = m
        .rows_data(file)
        .ok_or_else(|| BackendError::InvalidModel(format!("{}: outside the file", m.name)))?;
    match Packed::of(arena, m.ggml_type, raw, m.rows) {
        None => Ok(None),
        Some(Err(e)) => Err(BackendError::InvalidModel(format!("{}: {e}", m.name))),
        Some(Ok(packed)) => {
            m.packed = Some(Arc::new(packed));
            // A copy is not read again either: only its packed rows are.
            m.copy = None;
            Ok(Some(m.range.clone()).filter(|range| !range.is_empty()))
        }
    }
}

/// Bytes of the matrices the forward pass reads in the mapping (the tied head counted once;
/// the repacked ones are counted by [`packed_bytes`]).
pub fn mapped_bytes(weights: &Weights) -> usize {
    let in_file = |m: &Matrix| {
        if m.packed.is_some() || m.copy.is_some() {
            0
        } else {
            m.bytes()
        }
    };
    let layers: usize = weights
        .layers
        .iter()
        .map(|layer| {
            layer_matrices(layer)
                .into_iter()
                .map(in_file)
                .sum::<usize>()
        })
        .sum();
    let output =
        if weights.output.range == weights.token_embd.range && weights.output.packed.is_none() {
            0
        } else {
            in_file(&weights.output)
        };
    in_file(&weights.token_embd) + output + layers
}

/// Bytes of the repacked matrices.
pub fn packed_bytes(weights: &Weights) -> usize {
    let packed = |m: &Matrix| m.packed.as_ref().map_or(0, |p| p.bytes());
    let layers: usize = weights
        .layers
        .iter()
        .map(|layer| layer_matrices(layer).into_iter().map(packed).sum::<usize>())
        .sum();
    layers + packed(&weights.output)
}

/// Bytes of the f32 copies (norms and biases) and of the matrices' own copies that were not
/// repacked (the embeddings, when rewritten at load).
pub fn copied_bytes(weights: &Weights) -> usize {
    let copy = |m: &Matrix| m.copy.as_ref().map_or(0, |c| c.len());
    let matrices: usize = weights
        .layers
        .iter()
        .flat_map(layer_matrices)
        .map(copy)
        .sum::<usize>()
        + copy(&weights.token_embd)
        + if weights.output.copy.as_ref().map(Arc::as_ptr)
            == weights.token_embd.copy.as_ref().map(Arc::as_ptr)
        {
            0
        } else {
            copy(&weights.output)
        };
    let floats: usize = weights
        .layers
        .iter()
        .map(layer_copied_floats)
        .sum::<usize>()
        + weights.output_norm.len()
        + weights.output_bias.as_ref().map_or(0, Vec::len);
    floats * size_of::<f32>() + matrices
}

fn layer_matrices(layer: &Layer) -> Vec<&Matrix> {
    layer.matrices()
}

fn layer_copied_floats(layer: &Layer) -> usize {
    layer.vectors().into_iter().map(Vec::len).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arena is reserved with `packed_len`: it must be what each packing takes.
    #[test]
    fn packed_len_is_what_each_packing_takes() {
        let arena = Arena::new(1 << 20).unwrap();
        let types = [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
            GgmlType::IQ4_NL,
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::IQ4_XS,
        ];
        for ggml_type in types {
            let block = ggml_type.block_bytes() as usize;
            for rows in [1, 8, 13] {
                let row_bytes = 2 * block;
                let raw = vec![0u8; rows * row_bytes];
                let Some(packed) = Packed::of(&arena, ggml_type, &raw, rows) else {
                    assert!(!packed_k_available(), "{ggml_type} not repacked");
                    continue;
                };
                let packed = packed.unwrap();
                assert_eq!(
                    packed.bytes(),
                    packed_len(ggml_type, rows, row_bytes),
                    "{ggml_type}"
                );
            }
        }
    }
}
