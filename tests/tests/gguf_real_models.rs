//! The GGUF reader on the four real models and on llama.cpp's vocab files: the headers say what
//! the model cards say, every tensor's bytes are exactly what its type and shape need, and those
//! bytes are borrowed from the mapping.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use llorch_tests::assets::{Model, vocab_files};
use worker_common::gguf::{ArrayValue, GgmlType, Gguf, Value, ValueType};

/// What one model's header must hold.
struct Facts {
    architecture: &'static str,
    block_count: u32,
    embedding_length: u32,
    head_count: u32,
    head_count_kv: u32,
    rope_freq_base: f32,
    tokenizer_model: &'static str,
    tokenizer_pre: &'static str,
    tokens: u64,
    file_type: u32,
    /// How many tensors of each type; their sum is the tensor count.
    tensor_types: &'static [(GgmlType, usize)],
}

fn open(model: Model) -> Gguf {
    Gguf::open(model.path()).unwrap_or_else(|err| panic!("{}: {err}", model.file_name()))
}

/// Checks `facts` against `model` and returns the parsed file for the model's own extra facts.
fn assert_facts(model: Model, facts: &Facts) -> Gguf {
    let gguf = open(model);
    let arch = facts.architecture;
    let key = |suffix: &str| format!("{arch}.{suffix}");
    let u32_at = |key: &str| gguf.require::<u32>(key).unwrap();

    assert_eq!(gguf.require::<&str>("general.architecture").unwrap(), arch);
    assert_eq!(u32_at(&key("block_count")), facts.block_count);
    assert_eq!(u32_at(&key("embedding_length")), facts.embedding_length);
    assert_eq!(u32_at(&key("attention.head_count")), facts.head_count);
    assert_eq!(u32_at(&key("attention.head_count_kv")), facts.head_count_kv);
    assert_eq!(
        gguf.require::<f32>(&key("rope.freq_base")).unwrap(),
        facts.rope_freq_base
    );
    assert_eq!(u32_at("general.file_type"), facts.file_type);
    assert_eq!(
        gguf.require::<&str>("tokenizer.ggml.model").unwrap(),
        facts.tokenizer_model
    );
    assert_eq!(
        gguf.require::<&str>("tokenizer.ggml.pre").unwrap(),
        facts.tokenizer_pre
    );

    let tokens = gguf.require::<ArrayValue>("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.element_type(), ValueType::String);
    assert_eq!(tokens.len(), facts.tokens);
    // The embedding matrix has one row of `embedding_length` per token: the vocabulary and the
    // tensor infos agree.
    let embeddings = gguf.tensor("token_embd.weight").expect("token_embd.weight");
    assert_eq!(
        embeddings.shape,
        [u64::from(facts.embedding_length), facts.tokens]
    );

    let mut counts: BTreeMap<GgmlType, usize> = BTreeMap::new();
    for tensor in gguf.tensors() {
        *counts.entry(tensor.ggml_type).or_default() += 1;
    }
    let expected: BTreeMap<GgmlType, usize> = facts.tensor_types.iter().copied().collect();
    assert_eq!(counts, expected, "{}: tensors per type", model.file_name());
    assert_eq!(gguf.tensor_count(), expected.values().sum::<usize>());
    gguf
}

#[test]
fn smollm2_is_a_30_layer_llama_in_q4_1_with_the_smollm_tokenizer() {
    let facts = Facts {
        architecture: "llama",
        block_count: 30,
        embedding_length: 576,
        head_count: 9,
        head_count_kv: 3,
        rope_freq_base: 1e5,
        tokenizer_model: "gpt2",
        tokenizer_pre: "smollm",
        tokens: 49152,
        file_type: 3,
        tensor_types: &[
            (GgmlType::Q4_1, 210),
            (GgmlType::Q8_0, 1),
            (GgmlType::F32, 61),
        ],
    };
    let gguf = assert_facts(Model::SmolLm2, &facts);
    assert_eq!(gguf.tensor_count(), 272);
}

#[test]
fn qwen_coder_05b_is_a_24_layer_qwen2_in_q4_k_m_ending_on_im_end() {
    let facts = Facts {
        architecture: "qwen2",
        block_count: 24,
        embedding_length: 896,
        head_count: 14,
        head_count_kv: 2,
        rope_freq_base: 1e6,
        tokenizer_model: "gpt2",
        tokenizer_pre: "qwen2",
        tokens: 151936,
        file_type: 15,
        tensor_types: &[
            (GgmlType::Q5_0, 133),
            (GgmlType::Q8_0, 13),
            (GgmlType::Q6_K, 12),
            (GgmlType::Q4_K, 12),
            (GgmlType::F32, 121),
        ],
    };
    let gguf = assert_facts(Model::Qwen05, &facts);
    assert_eq!(
        gguf.require::<u32>("tokenizer.ggml.eos_token_id").unwrap(),
        151645
    );
}

#[test]
fn qwen_coder_15b_is_a_28_layer_qwen2_in_q4_k_m() {
    let facts = Facts {
        architecture: "qwen2",
        block_count: 28,
        embedding_length: 1536,
        head_count: 12,
        head_count_kv: 2,
        rope_freq_base: 1e6,
        tokenizer_model: "gpt2",
        tokenizer_pre: "qwen2",
        tokens: 151936,
        file_type: 15,
        tensor_types: &[
            (GgmlType::Q4_K, 169),
            (GgmlType::Q6_K, 29),
            (GgmlType::F32, 141),
        ],
    };
    let gguf = assert_facts(Model::Qwen15, &facts);
    assert_eq!(
        gguf.require::<u32>("tokenizer.ggml.eos_token_id").unwrap(),
        151645
    );
}

#[test]
fn gemma3_270m_has_one_kv_head_of_256_a_512_token_window_and_adds_bos() {
    let facts = Facts {
        architecture: "gemma3",
        block_count: 18,
        embedding_length: 640,
        head_count: 4,
        head_count_kv: 1,
        rope_freq_base: 1e6,
        tokenizer_model: "llama",
        tokenizer_pre: "default",
        tokens: 262144,
        file_type: 15,
        tensor_types: &[
            (GgmlType::Q5_0, 81),
            (GgmlType::Q8_0, 10),
            (GgmlType::Q4_K, 27),
            (GgmlType::Q6_K, 9),
            (GgmlType::F32, 109),
        ],
    };
    let gguf = assert_facts(Model::Gemma3, &facts);
    assert_eq!(
        gguf.require::<u32>("gemma3.attention.key_length").unwrap(),
        256
    );
    assert_eq!(
        gguf.require::<u32>("gemma3.attention.sliding_window")
            .unwrap(),
        512
    );
    assert!(
        gguf.require::<bool>("tokenizer.ggml.add_bos_token")
            .unwrap()
    );
}

/// (elements per block, bytes per block) from the `static_assert`s of llama.cpp's
/// ggml-common.h, written out here so the reader's own table is not checked against itself.
fn ggml_common_block(ggml_type: GgmlType) -> (u64, u64) {
    match ggml_type {
        GgmlType::F32 => (1, 4),
        GgmlType::Q4_1 => (32, 2 * 2 + 32 / 2),
        GgmlType::Q5_0 => (32, 2 + 4 + 32 / 2),
        GgmlType::Q8_0 => (32, 2 + 32),
        GgmlType::Q4_K => (256, 2 * 2 + 12 + 256 / 2),
        GgmlType::Q6_K => (256, 256 / 2 + 256 / 4 + 256 / 16 + 2),
        other => panic!("no block size for {other} yet: add it from ggml-common.h"),
    }
}

#[test]
fn every_tensor_holds_exactly_the_bytes_its_type_and_shape_need() {
    for model in Model::ALL {
        let gguf = open(model);
        for tensor in gguf.tensors() {
            let (block, block_bytes) = ggml_common_block(tensor.ggml_type);
            assert_eq!(
                tensor.shape[0] % block,
                0,
                "{}: row splits a block",
                tensor.name
            );
            let expected = tensor.elements() / block * block_bytes;
            assert_eq!(
                tensor.data.len() as u64,
                expected,
                "{} in {model:?}",
                tensor.name
            );
        }
    }
}

#[test]
fn tensor_data_is_borrowed_from_the_mapping_at_the_aligned_data_section() {
    for model in Model::ALL {
        let gguf = open(model);
        // None of the models sets `general.alignment`, so the default of 32 applies.
        assert_eq!(gguf.optional::<u32>("general.alignment").unwrap(), None);
        assert_eq!(gguf.alignment(), 32);
        assert_eq!(gguf.data_offset() as u64 % gguf.alignment(), 0);
        for tensor in gguf.tensors() {
            let start = gguf.data_offset() + tensor.offset as usize;
            // Same address, not equal bytes: the slice is the mapping itself, never a copy.
            assert_eq!(
                tensor.data.as_ptr(),
                gguf.bytes()[start..].as_ptr(),
                "{}",
                tensor.name
            );
            assert_eq!(tensor.offset % gguf.alignment(), 0, "{}", tensor.name);
            let by_name = gguf.tensor(tensor.name).expect("lookup by name");
            assert_eq!(
                by_name.data.as_ptr(),
                tensor.data.as_ptr(),
                "{}",
                tensor.name
            );
        }
    }
}

#[test]
fn tensors_fill_the_data_section_in_file_order_with_only_alignment_padding() {
    for model in Model::ALL {
        let gguf = open(model);
        let mut end = 0u64;
        for tensor in gguf.tensors() {
            // llama.cpp writes each tensor right after the previous one, padded to the alignment.
            assert_eq!(
                tensor.offset,
                end.next_multiple_of(gguf.alignment()),
                "{}",
                tensor.name
            );
            end = tensor.offset + tensor.data.len() as u64;
        }
        let data_len = (gguf.bytes().len() - gguf.data_offset()) as u64;
        assert!(
            end <= data_len && data_len - end < gguf.alignment(),
            "{model:?}: tail"
        );
    }
}

/// Checks a vocab file's tokenizer keys and returns its one-line summary.
fn vocab_summary<B: AsRef<[u8]>>(name: &str, gguf: &Gguf<B>) -> String {
    let model = gguf.require::<&str>("tokenizer.ggml.model").unwrap();
    let pre = gguf.optional::<&str>("tokenizer.ggml.pre").unwrap();
    let tokens = gguf.require::<ArrayValue>("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.element_type(), ValueType::String, "{name}");
    assert!(!tokens.is_empty(), "{name}: no tokens");
    // Decode every token so that a mis-sized string anywhere in the array shows up.
    let decoded = tokens
        .iter()
        .filter(|t| matches!(t, Value::String(_)))
        .count();
    assert_eq!(decoded as u64, tokens.len(), "{name}: tokens decoded");
    format!(
        "{name:<34} model={model:<6} pre={:<16} tokens={}",
        pre.unwrap_or("-"),
        tokens.len()
    )
}

#[test]
fn every_llama_cpp_vocab_file_parses_with_a_tokenizer_model_and_its_tokens() {
    let files = vocab_files();
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy();
        let gguf = Gguf::open(path).unwrap_or_else(|err| panic!("{name}: {err}"));
        eprintln!("{}", vocab_summary(&name, &gguf));
    }
    eprintln!("{} vocab files read", files.len());
}
