//! The one place tests find assets: `${LLORCH_ASSETS:-$HOME/.cache/llorch}`, filled by
//! `scripts/fetch-assets.sh`. A missing asset fails the test with the command that fetches it;
//! tests never skip silently.

use std::path::{Path, PathBuf};

/// The models of ASSETS.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    /// SmolLM2-135M-Instruct, Q4_1 (llama).
    SmolLm2,
    /// Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (qwen2).
    Qwen05,
    /// Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (qwen2).
    Qwen15,
    /// gemma-3-270m, Q4_K_M (gemma3).
    Gemma3,
}

impl Model {
    /// Every model, smallest first.
    pub const ALL: [Model; 4] = [Model::SmolLm2, Model::Gemma3, Model::Qwen05, Model::Qwen15];

    /// The file name in the cache.
    pub fn file_name(self) -> &'static str {
        match self {
            Model::SmolLm2 => "SmolLM2-135M-Instruct.Q4_1.gguf",
            Model::Qwen05 => "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            Model::Qwen15 => "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            Model::Gemma3 => "gemma-3-270m-q4_k_m.gguf",
        }
    }

    /// The `scripts/fetch-assets.sh` target that fetches it.
    pub fn fetch_target(self) -> &'static str {
        match self {
            Model::SmolLm2 => "smollm2",
            Model::Qwen05 => "qwen05",
            Model::Qwen15 => "qwen15",
            Model::Gemma3 => "gemma3",
        }
    }

    /// The model's path; panics (failing the test) with the fetch command when it is missing.
    pub fn path(self) -> PathBuf {
        require(
            assets_dir().join("models").join(self.file_name()),
            self.fetch_target(),
        )
    }
}

/// The asset cache: `$LLORCH_ASSETS`, else `$HOME/.cache/llorch`.
pub fn assets_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LLORCH_ASSETS") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    Path::new(&home).join(".cache").join("llorch")
}

/// llama.cpp's vocab-only files (`ggml-vocab-<name>.gguf`), sorted by name.
pub fn vocab_files() -> Vec<PathBuf> {
    let dir = require(assets_dir().join("vocab"), "vocab");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("cannot list {}: {err}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|ext| ext == "gguf"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no ggml-vocab-*.gguf in {}; run scripts/fetch-assets.sh vocab",
        dir.display()
    );
    files
}

/// The client libraries of `scripts/requirements-sdk.txt` (OpenAI's SDK), for `PYTHONPATH`.
pub fn python_sdk() -> PathBuf {
    require(assets_dir().join("python").join("sdk"), "python")
}

pub(crate) fn require(path: PathBuf, target: &str) -> PathBuf {
    assert!(
        path.exists(),
        "test asset {} is missing; run `scripts/fetch-assets.sh {target}` (cache: LLORCH_ASSETS)",
        path.display()
    );
    path
}

/// llama.cpp's test vectors for one vocab: each input text with the ids llama.cpp encodes it
/// to (add_special and parse_special off), from `ggml-vocab-<name>.gguf.inp` / `.out`.
pub struct VocabVectors {
    /// Path of the vocab-only GGUF.
    pub vocab: PathBuf,
    /// `(input, expected ids)` in file order.
    pub cases: Vec<(String, Vec<u32>)>,
}

/// Reads the vectors of `ggml-vocab-<name>.gguf`; inputs are separated by a
/// `__ggml_vocab_test__` line, and each output line holds one input's ids.
pub fn vocab_vectors(name: &str) -> VocabVectors {
    const SEPARATOR: &str = "\n__ggml_vocab_test__\n";
    let dir = require(assets_dir().join("vocab"), "vocab");
    let vocab = require(dir.join(format!("ggml-vocab-{name}.gguf")), "vocab");
    let read = |ext: &str| {
        let path = dir.join(format!("ggml-vocab-{name}.gguf.{ext}"));
        std::fs::read_to_string(&path)
            .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()))
    };
    let inputs = read("inp");
    let outputs = read("out");
    let mut texts: Vec<&str> = inputs.split(SEPARATOR).collect();
    // As in llama.cpp's read_tests, the separator after the last input is optional (the
    // gemma-4 file has none); when present it leaves one empty piece, which is no input.
    if texts.last() == Some(&"") {
        texts.pop();
    }
    let ids: Vec<Vec<u32>> = outputs
        .lines()
        .map(|line| {
            line.split_whitespace()
                .map(|id| id.parse().unwrap_or_else(|e| panic!("{name}.out: {e}")))
                .collect()
        })
        .collect();
    assert_eq!(
        texts.len(),
        ids.len(),
        "{name}: inputs and outputs differ in count"
    );
    VocabVectors {
        vocab,
        cases: texts.into_iter().map(str::to_owned).zip(ids).collect(),
    }
}

/// A model file the tests load: a real model of ASSETS.md or a synthetic one.
pub trait Asset {
    /// Its path in the asset cache; fails the test with the fetch command when it is missing.
    fn path(&self) -> PathBuf;
}

impl Asset for Model {
    fn path(&self) -> PathBuf {
        Model::path(*self)
    }
}

/// `model` loaded into backend `B` for `context_length` positions (default KV pool), with its
/// tokenizer: how the in-process backend tests start. Fails the test on any error.
pub fn load<B: worker_common::backend::Load>(
    model: impl Asset,
    options: &B::Options,
    context_length: usize,
    parallel: Option<usize>,
) -> (B, worker_common::tokenizer::Tokenizer) {
    let path = model.path();
    let fail = |what: &str, err: &dyn std::fmt::Display| -> ! {
        panic!("{what} {}: {err}", path.display())
    };
    let file = worker_common::model::ModelFile::open(&path).unwrap_or_else(|e| fail("opening", &e));
    let file = std::sync::Arc::new(file);
    let tokenizer = worker_common::tokenizer::Tokenizer::from_gguf(&file.gguf)
        .unwrap_or_else(|e| fail("reading the tokenizer of", &e));
    let config = worker_common::backend::LoadConfig {
        context_length,
        kv_cache_bytes: None,
        parallel,
    };
    let backend =
        B::load(file, options, &config, &mut |_| {}).unwrap_or_else(|e| fail("loading", &e));
    (backend, tokenizer)
}
