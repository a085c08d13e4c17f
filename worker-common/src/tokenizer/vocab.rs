//! The vocabulary of a GGUF file: token texts, types, scores, special ids, and the flags that
//! shape encoding, with llama.cpp b11434's defaults and text-based detection of special tokens.

use std::collections::{BTreeSet, HashMap};

use crate::gguf::{ArrayValue, Gguf, Value};

use super::TokenizerError;

/// The encoding algorithm named by `tokenizer.ggml.model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabModel {
    /// `gpt2`: byte-level BPE with a pre-tokenizer regex (`gguf-bpe`).
    Bpe,
    /// `llama`: SentencePiece with scores and byte fallback (`gguf-spm`).
    Spm,
    /// `gemma4`: BPE merges over raw UTF-8 with `▁` for spaces (`gguf-spm` family).
    Gemma4,
}

/// A token's type as GGUF stores it (`tokenizer.ggml.token_type`, `enum llama_token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// 0: not given.
    Undefined,
    /// 1: an ordinary token.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token (BOS, EOS, chat markers); matched in text only when parsing specials.
    Control,
    /// 4: a user-defined token; always matched atomically in text.
    UserDefined,
    /// 5: an unused slot.
    Unused,
    /// 6: a `<0xNN>` byte token (SentencePiece byte fallback).
    Byte,
}

impl TokenType {
    fn from_id(id: i64) -> Self {
        match id {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }

    /// Whether the token is matched as a whole in the input before the model's algorithm runs.
    pub fn is_special(self) -> bool {
        matches!(
            self,
            TokenType::Control | TokenType::UserDefined | TokenType::Unknown
        )
    }
}

/// Ids of tokens with a role; `None` when the vocabulary has no such token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialIds {
    /// Beginning of sequence.
    pub bos: Option<u32>,
    /// End of sequence.
    pub eos: Option<u32>,
    /// End of turn (`<|im_end|>`, `<end_of_turn>`, `<|eot_id|>`, …).
    pub eot: Option<u32>,
    /// End of message (`<|eom_id|>`).
    pub eom: Option<u32>,
    /// Unknown token.
    pub unk: Option<u32>,
    /// Separator.
    pub sep: Option<u32>,
    /// Padding.
    pub pad: Option<u32>,
}

/// Token texts and everything about them that encoding and decoding need.
#[derive(Debug, Clone)]
pub struct Vocab {
    model: VocabModel,
    pre: String,
    texts: Vec<String>,
    types: Vec<TokenType>,
    scores: Vec<f32>,
    ids: HashMap<String, u32>,
    special: SpecialIds,
    eog: BTreeSet<u32>,
    /// Tokens matched atomically in text, longest text first.
    specials_by_length: Vec<u32>,
    /// Tokens after which whitespace is dropped when partitioning (llama.cpp's RSTRIP).
    rstrip: BTreeSet<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
}

/// Texts whose token ends generation (llama.cpp's list, matched exactly).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Texts recognised as end of turn when the file names no `eot_token_id`.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Fill-in-the-middle padding, repository and file-separator tokens, which also end generation.
const FIM_EOG_TEXTS: &[&str] = &[
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
];

impl Vocab {
    /// Reads the vocabulary of `gguf` (`tokenizer.ggml.*`).
    pub fn from_gguf<B: AsRef<[u8]>>(gguf: &Gguf<B>) -> Result<Self, TokenizerError> {
        let model_name = gguf.require::<&str>("tokenizer.ggml.model")?;
        let model = match model_name {
            "gpt2" => VocabModel::Bpe,
            "llama" => VocabModel::Spm,
            "gemma4" => VocabModel::Gemma4,
            other => {
                return Err(TokenizerError::UnsupportedModel {
                    model: other.to_owned(),
                    supported: "gpt2 (BPE), llama (SentencePiece), gemma4",
                });
            }
        };
        let texts = read_texts(gguf.require::<ArrayValue>("tokenizer.ggml.tokens")?)?;
        let n_tokens = texts.len();
        let types = read_array(gguf, "tokenizer.ggml.token_type", n_tokens, |v| {
            v.as_integer().map(|id| TokenType::from_id(id as i64))
        })?
        .unwrap_or_else(|| vec![TokenType::Normal; n_tokens]);
        let scores = read_array(gguf, "tokenizer.ggml.scores", n_tokens, |v| match v {
            Value::F32(s) => Some(s),
            _ => None,
        })?
        .unwrap_or_else(|| vec![0.0; n_tokens]);
        let mut ids = HashMap::with_capacity(n_tokens);
        for (id, text) in texts.iter().enumerate() {
            // Later duplicates win, as in llama.cpp's token_to_id map.
            ids.insert(text.clone(), id as u32);
        }
        let mut vocab = Self {
            model,
            pre: gguf
                .optional::<&str>("tokenizer.ggml.pre")?
                .unwrap_or("default")
                .to_owned(),
            texts,
            types,
            scores,
            ids,
            special: SpecialIds::default(),
            eog: BTreeSet::new(),
            specials_by_length: Vec::new(),
            rstrip: BTreeSet::new(),
            add_bos: false,
            add_eos: false,
            add_space_prefix: false,
        };
        vocab.read_flags(gguf)?;
        vocab.read_special_ids(gguf)?;
        vocab.detect_end_of_generation();
        vocab.index_specials(gguf)?;
        Ok(vocab)
    }

    /// The encoding algorithm.
    pub fn model(&self) -> VocabModel {
        self.model
    }

    /// `tokenizer.ggml.pre` (the pre-tokenizer of BPE vocabularies), `default` when absent.
    pub fn pre(&self) -> &str {
        &self.pre
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.texts.len()
    }

    /// Whether the vocabulary is empty (never true for a loaded one).
    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }

    /// The stored text of token `id` (byte-mapped for BPE, `▁` for spaces in SentencePiece).
    pub fn text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// The type of token `id`.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// The score of token `id` (SentencePiece merge priority; 0 when the file has none).
    pub fn score(&self, id: u32) -> Option<f32> {
        self.scores.get(id as usize).copied()
    }

    /// The id of the token whose stored text is `text`.
    pub fn id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// Ids of tokens with a role.
    pub fn special(&self) -> &SpecialIds {
        &self.special
    }

    /// Tokens that end generation: eos, end-of-turn and similar markers.
    pub fn end_of_generation(&self) -> &BTreeSet<u32> {
        &self.eog
    }

    /// Whether token `id` is special (control, user-defined or unknown): never emitted as text.
    pub fn is_special(&self, id: u32) -> bool {
        self.token_type(id).is_some_and(TokenType::is_special)
    }

    /// Whether encoding with specials prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether encoding with specials appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether SentencePiece prefixes a space to text that follows the start or a special token.
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// Special tokens in the order the partitioner tries them (longest text first).
    pub(crate) fn specials_by_length(&self) -> &[u32] {
        &self.specials_by_length
    }

    /// Whether whitespace after token `id` is dropped when it is matched in text.
    pub(crate) fn strips_right(&self, id: u32) -> bool {
        self.rstrip.contains(&id)
    }

    fn read_flags<B: AsRef<[u8]>>(&mut self, gguf: &Gguf<B>) -> Result<(), TokenizerError> {
        // llama.cpp's defaults per algorithm, then the file's flags.
        (self.add_bos, self.add_space_prefix) = match self.model {
            VocabModel::Spm => (true, true),
            VocabModel::Bpe | VocabModel::Gemma4 => (false, false),
        };
        // llama.cpp turns BOS on for these BPE pre-tokenizers (llama3's family, tekken,
        // chameleon) before reading the file's flag, so e.g. ggml-vocab-llama-bpe.gguf gets BOS.
        const BPE_BOS_BY_DEFAULT: &[&str] = &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
            "tekken",
            "chameleon",
        ];
        if self.model == VocabModel::Bpe && BPE_BOS_BY_DEFAULT.contains(&self.pre.as_str()) {
            self.add_bos = true;
        }
        if let Some(flag) = gguf.optional::<bool>("tokenizer.ggml.add_space_prefix")? {
            self.add_space_prefix = flag;
        }
        if let Some(flag) = gguf.optional::<bool>("tokenizer.ggml.add_bos_token")? {
            self.add_bos = flag;
        }
        if let Some(flag) = gguf.optional::<bool>("tokenizer.ggml.add_eos_token")? {
            self.add_eos = flag;
        }
        if self.model == VocabModel::Gemma4 {
            // llama.cpp forces BOS for Gemma 4 whatever the file says (ggml-org/llama.cpp#21500).
            self.add_bos = true;
        }
        Ok(())
    }

    fn read_special_ids<B: AsRef<[u8]>>(&mut self, gguf: &Gguf<B>) -> Result<(), TokenizerError> {
        let in_range = |id: u32| (id as usize) < self.texts.len();
        let defaults = match self.model {
            VocabModel::Spm => [Some(1), Some(2), Some(0)],
            VocabModel::Bpe => [Some(11), Some(11), None],
            VocabModel::Gemma4 => [None, None, None],
        };
        let [bos, eos, unk] = defaults.map(|id| id.filter(|&id| in_range(id)));
        let read = |name: &str, default: Option<u32>| -> Result<Option<u32>, TokenizerError> {
            let key = format!("tokenizer.ggml.{name}_token_id");
            // An out-of-range id keeps the default, as llama.cpp does.
            Ok(gguf
                .optional::<u32>(&key)?
                .filter(|&id| in_range(id))
                .or(default))
        };
        self.special = SpecialIds {
            bos: read("bos", bos)?,
            eos: read("eos", eos)?,
            eot: read("eot", None)?,
            eom: read("eom", None)?,
            unk: read("unknown", unk)?,
            sep: read("seperator", None)?,
            pad: read("padding", None)?,
        };
        Ok(())
    }

    /// The end-of-generation set, detected from token texts as llama.cpp does.
    fn detect_end_of_generation(&mut self) {
        let lowest_of =
            |texts: &[&str]| texts.iter().filter_map(|t| self.ids.get(*t).copied()).min();
        if self.special.eot.is_none() {
            self.special.eot = lowest_of(EOT_TEXTS);
        }
        if self.special.eom.is_none() {
            self.special.eom = self.id("<|eom_id|>");
        }
        let named = EOG_TEXTS
            .iter()
            .chain(FIM_EOG_TEXTS)
            .filter_map(|t| self.ids.get(*t).copied());
        let roles = [self.special.eos, self.special.eot, self.special.eom]
            .into_iter()
            .flatten();
        self.eog = named.chain(roles).collect();
        for &id in &self.eog {
            // A token that ends generation is control, even if the file says user-defined
            // (llama.cpp adds the control attribute): it is then only matched in text when
            // specials are parsed, and it never decodes to text.
            if let Some(t) = self.types.get_mut(id as usize)
                && !matches!(t, TokenType::Control | TokenType::Unknown)
            {
                *t = TokenType::Control;
            }
        }
        self.apply_eog_exceptions();
        self.render_harmony_markers();
    }

    /// llama.cpp makes harmony's structural markers user-defined in any vocabulary that has
    /// them, so they are matched in text even without special parsing and always rendered
    /// (gpt-oss's output is parsed for its channels).
    fn render_harmony_markers(&mut self) {
        for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = self.id(text) {
                self.types[id as usize] = TokenType::UserDefined;
            }
        }
    }

    /// llama.cpp's two exceptions to text-based detection: o200k_harmony-style vocabularies use
    /// `<|end|>` between messages, and Gemma 4 / PLaMo have an ordinary `</s>`.
    fn apply_eog_exceptions(&mut self) {
        let has = |text: &str| self.id(text).is_some_and(|id| self.eog.contains(&id));
        let harmony = has("<|end|>")
            && ((has("<|return|>") && has("<|call|>"))
                || ((has("<|call|>") || has("<|calls|>")) && has("<|flush|>")));
        let normal_s = has("</s>") && (has("<|tool_response>") || has("<|plamo:eos|>"));
        for (text, exempt, token_type) in [
            ("<|end|>", harmony, TokenType::UserDefined),
            ("</s>", normal_s, TokenType::Normal),
        ] {
            if let (true, Some(id)) = (exempt, self.id(text)) {
                self.eog.remove(&id);
                self.types[id as usize] = token_type;
            }
        }
    }

    fn index_specials<B: AsRef<[u8]>>(&mut self, gguf: &Gguf<B>) -> Result<(), TokenizerError> {
        let mut specials: Vec<u32> = (0..self.texts.len() as u32)
            .filter(|&id| self.types[id as usize].is_special())
            .collect();
        specials.sort_by_key(|&id| (std::cmp::Reverse(self.texts[id as usize].len()), id));
        self.specials_by_length = specials;
        // llama.cpp strips whitespace after Phi-3's special tokens (the model was trained so).
        let name = gguf
            .optional::<&str>("general.name")?
            .unwrap_or_default()
            .to_lowercase();
        if name.contains("phi-3") || name.contains("phi3") {
            self.rstrip = self.specials_by_length.iter().copied().collect();
            self.rstrip.extend(self.id("</s>"));
            for keep in ["<unk>", "<s>", "<|endoftext|>"] {
                if let Some(id) = self.id(keep) {
                    self.rstrip.remove(&id);
                }
            }
        }
        Ok(())
    }
}

fn read_texts(tokens: ArrayValue<'_>) -> Result<Vec<String>, TokenizerError> {
    if tokens.is_empty() {
        return Err(TokenizerError::InvalidVocab {
            reason: "tokenizer.ggml.tokens is empty".into(),
        });
    }
    tokens
        .iter()
        .enumerate()
        .map(|(id, value)| match value {
            Value::String(bytes) => Ok(String::from_utf8_lossy(bytes).into_owned()),
            other => Err(TokenizerError::InvalidVocab {
                reason: format!(
                    "tokenizer.ggml.tokens[{id}] is a {}, expected a string",
                    other.type_description()
                ),
            }),
        })
        .collect()
}

/// An optional per-token array of `n_tokens` elements, each converted by `convert`.
fn read_array<B: AsRef<[u8]>, T>(
    gguf: &Gguf<B>,
    key: &str,
    n_tokens: usize,
    convert: impl Fn(Value<'_>) -> Option<T>,
) -> Result<Option<Vec<T>>, TokenizerError> {
    let Some(array) = gguf.optional::<ArrayValue>(key)? else {
        return Ok(None);
    };
    if array.len() != n_tokens as u64 {
        return Err(TokenizerError::InvalidVocab {
            reason: format!("{key} has {} entries for {n_tokens} tokens", array.len()),
        });
    }
    array
        .iter()
        .enumerate()
        .map(|(i, v)| {
            convert(v).ok_or_else(|| TokenizerError::InvalidVocab {
                reason: format!("{key}[{i}] is a {}", v.type_description()),
            })
        })
        .collect::<Result<Vec<T>, _>>()
        .map(Some)
}
