//! Tokenizers conformant with llama.cpp: GGUF byte-level BPE (`gguf-bpe`), GGUF SentencePiece
//! (`gguf-spm`), and `tokenizer.json` files (`hf-json`).
//!
//! Encoding runs in three steps that every algorithm shares: special tokens are matched as a
//! whole (`special.rs`), the text between them goes to the vocabulary's algorithm (`Encoder`),
//! and BOS/EOS are added as the vocabulary asks. Decoding maps each id to its bytes; special
//! tokens decode to nothing, so they can never leak into generated text.

mod bpe;
mod byte_map;
mod gemma4;
mod pretokenize;
mod special;
mod spm;
mod vocab;

pub mod hf;
pub mod render_process;
pub mod stream;
pub mod template;
mod template_json;

use std::path::Path;

use crate::gguf::{Gguf, GgufError};

use hf::{HfError, HfTokenizer};

pub use vocab::{SpecialIds, TokenType, Vocab, VocabModel};

use special::Fragment;

/// Why a vocabulary cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The file's metadata is missing a key or has the wrong type.
    #[error(transparent)]
    Gguf(#[from] GgufError),

    /// `tokenizer.ggml.model` names an algorithm we do not implement.
    #[error("unsupported tokenizer model {model:?} (tokenizer.ggml.model); supported: {supported}")]
    UnsupportedModel {
        /// The model in the file.
        model: String,
        /// The ones we implement.
        supported: &'static str,
    },

    /// `tokenizer.ggml.pre` names a pre-tokenizer we do not implement.
    #[error("unknown pre-tokenizer {pre:?} (tokenizer.ggml.pre); supported: {supported}")]
    UnknownPreTokenizer {
        /// The pre-tokenizer in the file.
        pre: String,
        /// The ones we implement.
        supported: String,
    },

    /// A `tokenizer.json` could not be loaded or failed on a text.
    #[error(transparent)]
    Hf(#[from] HfError),

    /// The vocabulary, its scores, types or merges are inconsistent.
    #[error("invalid vocabulary: {reason}")]
    InvalidVocab {
        /// What is wrong, naming the key and index.
        reason: String,
    },
}

/// Which tokenizer implementation serves a model (reported in `/health` as `tokenizer_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerKind {
    /// GGUF byte-level BPE.
    GgufBpe,
    /// GGUF SentencePiece (and Gemma 4's SentencePiece-style BPE).
    GgufSpm,
    /// A `tokenizer.json` beside the model.
    HfJson,
}

impl TokenizerKind {
    /// The contract's label: `gguf-bpe`, `gguf-spm` or `hf-json`.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenizerKind::GgufBpe => "gguf-bpe",
            TokenizerKind::GgufSpm => "gguf-spm",
            TokenizerKind::HfJson => "hf-json",
        }
    }
}

/// The part of tokenization that differs between algorithms.
pub(crate) trait Encoder: Send + Sync + std::fmt::Debug {
    /// Appends the ids of `text`, a fragment free of special tokens. `after_special` is true at
    /// the start of the input and right after a special token (SentencePiece adds its space
    /// prefix there).
    fn encode_text(&self, vocab: &Vocab, text: &str, after_special: bool, out: &mut Vec<u32>);

    /// The bytes token `id` stands for in decoded text; never called for special tokens.
    fn token_bytes(&self, vocab: &Vocab, id: u32) -> Vec<u8>;
}

/// A model's tokenizer: the GGUF vocabulary with its algorithm, or a `tokenizer.json` beside
/// the model. The GGUF vocabulary provides the special ids and the end-of-generation set either
/// way (the two describe the same token ids).
#[derive(Debug)]
pub struct Tokenizer {
    vocab: Vocab,
    encoder: Box<dyn Encoder>,
    hf: Option<HfTokenizer>,
}

impl Tokenizer {
    /// Builds the tokenizer described by `gguf`'s `tokenizer.ggml.*` metadata.
    pub fn from_gguf<B: AsRef<[u8]>>(gguf: &Gguf<B>) -> Result<Self, TokenizerError> {
        let vocab = Vocab::from_gguf(gguf)?;
        let encoder: Box<dyn Encoder> = match vocab.model() {
            VocabModel::Bpe => Box::new(bpe::BpeEncoder::new(gguf, &vocab)?),
            VocabModel::Spm => Box::new(spm::SpmEncoder::new(&vocab)?),
            VocabModel::Gemma4 => Box::new(gemma4::Gemma4Encoder::new(gguf, &vocab)?),
        };
        Ok(Self {
            vocab,
            encoder,
            hf: None,
        })
    }

    /// The tokenizer a worker uses for the model at `model_path`: the `tokenizer.json` named by
    /// `tokenizer_json`, else one beside the model file, else the GGUF vocabulary.
    pub fn for_model<B: AsRef<[u8]>>(
        gguf: &Gguf<B>,
        model_path: &Path,
        tokenizer_json: Option<&Path>,
    ) -> Result<Self, TokenizerError> {
        let mut tokenizer = Self::from_gguf(gguf)?;
        let json = tokenizer_json
            .map(Path::to_path_buf)
            .or_else(|| hf::tokenizer_json_beside(model_path));
        if let Some(path) = json {
            let hf = HfTokenizer::from_file(&path)?;
            if hf.vocab_size() > tokenizer.vocab.len() {
                return Err(TokenizerError::InvalidVocab {
                    reason: format!(
                        "{} has {} tokens, more than the model's {}",
                        path.display(),
                        hf.vocab_size(),
                        tokenizer.vocab.len()
                    ),
                });
            }
            tokenizer.hf = Some(hf);
        }
        Ok(tokenizer)
    }

    /// Which implementation this is.
    pub fn kind(&self) -> TokenizerKind {
        if self.hf.is_some() {
            return TokenizerKind::HfJson;
        }
        match self.vocab.model() {
            VocabModel::Bpe => TokenizerKind::GgufBpe,
            VocabModel::Spm | VocabModel::Gemma4 => TokenizerKind::GgufSpm,
        }
    }

    /// The vocabulary.
    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    /// Token ids of `text`. `add_special` adds BOS/EOS as the vocabulary asks; `parse_special`
    /// matches control tokens written in the text (user-defined tokens are always matched; a
    /// `tokenizer.json` always matches its added tokens). Only `hf-json` can fail.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        if let Some(hf) = &self.hf {
            return Ok(hf.encode(text, add_special)?);
        }
        let mut ids = Vec::new();
        let special = self.vocab.special();
        if add_special && self.vocab.add_bos() {
            ids.extend(special.bos);
        }
        let mut after_special = true;
        for fragment in special::partition(&self.vocab, text, parse_special) {
            match fragment {
                Fragment::Text(text) => {
                    self.encoder
                        .encode_text(&self.vocab, text, after_special, &mut ids);
                    after_special = false;
                }
                Fragment::Token(id) => {
                    ids.push(id);
                    after_special = true;
                }
            }
        }
        if add_special && self.vocab.add_eos() {
            ids.extend(special.eos);
        }
        Ok(ids)
    }

    /// The bytes token `id` adds to decoded text: nothing for control and unknown tokens or
    /// ids outside the vocabulary, the stored text for user-defined tokens.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        if let Some(hf) = &self.hf {
            return if self.vocab.is_special(id) {
                Vec::new()
            } else {
                hf.token_bytes(id)
            };
        }
        match self.vocab.token_type(id) {
            None | Some(TokenType::Control | TokenType::Unknown) => Vec::new(),
            Some(TokenType::UserDefined) => {
                self.vocab.text(id).unwrap_or_default().as_bytes().to_vec()
            }
            Some(_) => self.encoder.token_bytes(&self.vocab, id),
        }
    }

    /// The text of `ids` (special tokens omitted; invalid UTF-8 replaced by U+FFFD).
    ///
    /// As llama.cpp's `llama_detokenize` (special tokens neither removed nor rendered), a
    /// vocabulary with `add_space_prefix` loses one leading space of the first token, the one
    /// encoding prefixed: `decode(encode(text, false, false)) == text`.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let piece = self.token_bytes(id);
            let piece = match piece.split_first() {
                Some((b' ', rest)) if i == 0 && self.strips_leading_space() => rest,
                _ => &piece,
            };
            bytes.extend_from_slice(piece);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Whether decoding drops one leading space from the first token (SentencePiece's space
    /// prefix; llama.cpp's `llama_detokenize` does the same).
    pub fn strips_leading_space(&self) -> bool {
        match &self.hf {
            Some(hf) => hf.strips_leading_space(),
            None => self.vocab.add_space_prefix(),
        }
    }

    /// Whether `id` ends generation (eos, end of turn, …).
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.vocab.end_of_generation().contains(&id)
    }
}
