//! `ModelSpec` on the four real models: the hyper-parameters of ASSETS.md, and errors that name
//! the tensor when a copy of a model loses or reshapes one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use llorch_tests::assets::Model;
use llorch_tests::gguf_writer::{GgufBuilder, OwnedValue};
use worker_common::gguf::{GgmlType, Gguf};
use worker_common::model::{Architecture, ModelError, ModelSpec, QkvLayout, RopeStyle};

fn spec(model: Model) -> ModelSpec {
    let gguf = Gguf::open(model.path()).expect("model parses");
    ModelSpec::from_gguf(&gguf).unwrap_or_else(|err| panic!("{}: {err}", model.file_name()))
}

#[test]
fn smollm2_is_a_tied_llama_with_normal_rope() {
    let spec = spec(Model::SmolLm2);
    let hp = &spec.hparams;
    assert_eq!(spec.architecture, Architecture::Llama);
    assert_eq!(spec.quant_kind, "Q4_1");
    assert_eq!(
        spec.formats,
        [GgmlType::F32, GgmlType::Q4_1, GgmlType::Q8_0]
    );
    assert_eq!((hp.n_layers, hp.n_embd, hp.n_ff), (30, 576, 1536));
    assert_eq!(
        (hp.n_head, hp.n_head_kv, hp.head_dim_k, hp.head_dim_v),
        (9, 3, 64, 64)
    );
    assert_eq!((hp.vocab_size, hp.context_length), (49152, 8192));
    assert_eq!(hp.rope.freq_base, 100_000.0);
    assert_eq!((hp.rope.style, hp.rope.dimensions), (RopeStyle::Normal, 64));
    assert_eq!(hp.norm_eps, 1e-5);
    assert!(spec.tied_output);
    assert!(!spec.qkv_bias);
    assert_eq!(spec.qkv_layout, QkvLayout::Separate);
    assert!(hp.sliding_window.is_none());
}

#[test]
fn qwen_05b_has_biases_neox_rope_and_an_untied_output() {
    let spec = spec(Model::Qwen05);
    let hp = &spec.hparams;
    assert_eq!(spec.architecture, Architecture::Qwen2);
    assert_eq!(spec.quant_kind, "Q4_K_M");
    assert_eq!((hp.n_layers, hp.n_embd, hp.n_ff), (24, 896, 4864));
    assert_eq!((hp.n_head, hp.n_head_kv, hp.head_dim_k), (14, 2, 64));
    assert_eq!((hp.vocab_size, hp.context_length), (151936, 32768));
    assert_eq!(
        (hp.rope.style, hp.rope.freq_base),
        (RopeStyle::Neox, 1_000_000.0)
    );
    assert!(spec.qkv_bias);
    assert!(!spec.tied_output);
}

#[test]
fn qwen_15b_has_28_layers_of_1536() {
    let spec = spec(Model::Qwen15);
    let hp = &spec.hparams;
    assert_eq!(spec.architecture, Architecture::Qwen2);
    assert_eq!((hp.n_layers, hp.n_embd, hp.n_ff), (28, 1536, 8960));
    assert_eq!((hp.n_head, hp.n_head_kv, hp.head_dim_k), (12, 2, 128));
    assert!(spec.qkv_bias);
}

#[test]
fn gemma3_270m_has_wide_heads_and_a_sliding_window_on_five_of_six_layers() {
    let spec = spec(Model::Gemma3);
    let hp = &spec.hparams;
    assert_eq!(spec.architecture, Architecture::Gemma3);
    assert_eq!(spec.quant_kind, "Q4_K_M");
    assert_eq!((hp.n_layers, hp.n_embd, hp.n_ff), (18, 640, 2048));
    assert_eq!(
        (hp.n_head, hp.n_head_kv, hp.head_dim_k, hp.head_dim_v),
        (4, 1, 256, 256)
    );
    assert_eq!((hp.vocab_size, hp.context_length), (262144, 32768));
    assert_eq!(
        (hp.rope.style, hp.rope.freq_base, hp.rope.freq_base_swa),
        (RopeStyle::Neox, 1e6, 1e4)
    );
    assert_eq!(hp.norm_eps, 1e-6);
    let window = hp
        .sliding_window
        .as_ref()
        .expect("gemma3 has a sliding window");
    assert_eq!(window.size, 512);
    let global: Vec<usize> = (0..18).filter(|&il| !window.layers[il]).collect();
    assert_eq!(global, vec![5, 11, 17]);
    assert!(spec.tied_output);
}

#[test]
fn every_tensor_of_every_model_is_expected() {
    for model in Model::ALL {
        let gguf = Gguf::open(model.path()).expect("model parses");
        let spec = ModelSpec::from_gguf(&gguf).expect("spec builds");
        let present = spec
            .tensors
            .iter()
            .filter(|t| gguf.tensor(&t.name).is_some())
            .count();
        assert_eq!(present, gguf.tensor_count(), "{}", model.file_name());
    }
}

/// Builds the spec of a copy of SmolLM2 changed by `edit`; the copy must still be valid GGUF.
fn spec_of_edited_smollm2(
    edit: impl FnOnce(&mut GgufBuilder<'_>),
) -> Result<ModelSpec, ModelError> {
    let original = Gguf::open(Model::SmolLm2.path()).expect("model parses");
    let mut copy = GgufBuilder::from_gguf(&original);
    edit(&mut copy);
    let edited = Gguf::parse(copy.to_bytes()).expect("the edited copy is valid GGUF");
    ModelSpec::from_gguf(&edited)
}

#[test]
fn an_unedited_copy_still_builds() {
    assert_eq!(
        spec_of_edited_smollm2(|_| {}).expect("copy builds"),
        spec(Model::SmolLm2)
    );
}

#[test]
fn a_removed_tensor_is_named() {
    let err = spec_of_edited_smollm2(|copy| assert!(copy.remove_tensor("blk.7.ffn_up.weight")))
        .unwrap_err();
    assert!(
        matches!(&err, ModelError::MissingTensor { name, .. } if name == "blk.7.ffn_up.weight"),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "tensor \"blk.7.ffn_up.weight\" is missing (required by architecture llama)"
    );
}

#[test]
fn a_reshaped_tensor_is_named_with_both_shapes() {
    // Same bytes, transposed: still valid GGUF, wrong for the model.
    let err = spec_of_edited_smollm2(|copy| {
        assert!(copy.set_tensor_shape("blk.3.attn_k.weight", &[192, 576]))
    })
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor \"blk.3.attn_k.weight\" has shape [192, 576], expected [576, 192]"
    );
}

#[test]
fn a_tensor_the_architecture_does_not_read_is_refused() {
    let err = spec_of_edited_smollm2(|copy| {
        copy.tensor(
            "blk.0.mystery.weight",
            worker_common::gguf::GgmlType::F32,
            &[4],
            vec![0u8; 16],
        );
    })
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "unexpected tensor \"blk.0.mystery.weight\" for architecture llama"
    );
}

#[test]
fn an_unsupported_architecture_lists_the_supported_ones() {
    let err = spec_of_edited_smollm2(|copy| {
        copy.metadata("general.architecture", OwnedValue::string("gpt2"));
    })
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "unsupported architecture gpt2, supported: llama, qwen2, gemma3, phi3, qwen3, gpt-oss"
    );
}

#[test]
fn missing_and_wrongly_typed_keys_are_named() {
    let err = spec_of_edited_smollm2(|copy| {
        copy.remove_metadata("llama.block_count");
    })
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "metadata key \"llama.block_count\" is missing"
    );

    let err = spec_of_edited_smollm2(|copy| {
        copy.metadata("llama.embedding_length", OwnedValue::string("576"));
    })
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "metadata key \"llama.embedding_length\" has type string, expected u64"
    );
}

#[test]
fn inconsistent_or_hostile_hyper_parameters_are_refused() {
    let err = spec_of_edited_smollm2(|copy| {
        copy.metadata("llama.attention.head_count_kv", OwnedValue::U32(4));
    })
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("llama.attention.head_count_kv\" = 4 is invalid"),
        "{err}"
    );

    let err = spec_of_edited_smollm2(|copy| {
        copy.metadata("llama.attention.head_count", OwnedValue::U32(1000));
    })
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("llama.attention.head_count\" = 1000 is invalid")
            && err.to_string().contains("embedding_length = 576"),
        "{err}"
    );

    let err = spec_of_edited_smollm2(|copy| {
        copy.metadata("llama.block_count", OwnedValue::U32(100_000));
    })
    .unwrap_err();
    assert!(
        err.to_string().contains("the file has only 272 tensors"),
        "{err}"
    );

    let err = spec_of_edited_smollm2(|copy| {
        copy.metadata("llama.feed_forward_length", OwnedValue::U64(u64::MAX));
    })
    .unwrap_err();
    assert!(
        err.to_string().contains("expected a count in 1..=16777216"),
        "{err}"
    );
}

/// A tiny phi3 model (F32 zeros) with fused QKV and fused gate-up, as no phi3 weights are among
/// the assets: the spec must accept the fused layout and derive the widths from it.
fn tiny_phi3(builder: &mut GgufBuilder<'_>) {
    let (n_embd, n_ff, n_vocab) = (64u64, 128u64, 32u64);
    builder
        .metadata("general.architecture", OwnedValue::string("phi3"))
        .metadata("phi3.block_count", OwnedValue::U32(2))
        .metadata("phi3.embedding_length", OwnedValue::U32(n_embd as u32))
        .metadata("phi3.feed_forward_length", OwnedValue::U32(n_ff as u32))
        .metadata("phi3.attention.head_count", OwnedValue::U32(4))
        .metadata("phi3.attention.head_count_kv", OwnedValue::U32(4))
        .metadata("phi3.context_length", OwnedValue::U32(4096))
        .metadata("phi3.attention.sliding_window", OwnedValue::U32(2047))
        .metadata(
            "phi3.attention.layer_norm_rms_epsilon",
            OwnedValue::F32(1e-5),
        )
        .metadata("phi3.vocab_size", OwnedValue::U32(n_vocab as u32));
    let mut tensor = |name: &str, shape: &[u64]| {
        let bytes = shape.iter().product::<u64>() as usize * 4;
        builder.tensor(name, GgmlType::F32, shape, vec![0u8; bytes]);
    };
    tensor("token_embd.weight", &[n_embd, n_vocab]);
    tensor("output_norm.weight", &[n_embd]);
    tensor("output.weight", &[n_embd, n_vocab]);
    for il in 0..2 {
        tensor(&format!("blk.{il}.attn_norm.weight"), &[n_embd]);
        tensor(&format!("blk.{il}.attn_qkv.weight"), &[n_embd, 3 * n_embd]);
        tensor(&format!("blk.{il}.attn_output.weight"), &[n_embd, n_embd]);
        tensor(&format!("blk.{il}.ffn_norm.weight"), &[n_embd]);
        tensor(&format!("blk.{il}.ffn_up.weight"), &[n_embd, 2 * n_ff]);
        tensor(&format!("blk.{il}.ffn_down.weight"), &[n_ff, n_embd]);
    }
}

#[test]
fn a_phi3_model_with_fused_qkv_and_gate_up_builds() {
    let mut builder = GgufBuilder::new();
    tiny_phi3(&mut builder);
    let gguf = Gguf::parse(builder.to_bytes()).unwrap();
    let spec = ModelSpec::from_gguf(&gguf).unwrap();
    assert_eq!(spec.architecture, Architecture::Phi3);
    assert_eq!(spec.qkv_layout, QkvLayout::Fused);
    assert_eq!(spec.hparams.rope.style, RopeStyle::Neox);
    assert_eq!((spec.hparams.head_dim_k, spec.hparams.n_head_kv), (16, 4));
    assert!(
        spec.hparams.sliding_window.is_none(),
        "llama.cpp disables phi3's window; so do we"
    );
    assert!(!spec.tied_output && !spec.qkv_bias);
    assert_eq!(spec.quant_kind, "unknown");
}

#[test]
fn a_phi3_model_with_a_split_gate_is_refused_naming_the_tensor() {
    let mut builder = GgufBuilder::new();
    tiny_phi3(&mut builder);
    builder.tensor(
        "blk.1.ffn_up.weight",
        GgmlType::F32,
        &[64, 128],
        vec![0u8; 64 * 128 * 4],
    );
    let err = ModelSpec::from_gguf(&Gguf::parse(builder.to_bytes()).unwrap()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor \"blk.1.ffn_up.weight\" has shape [64, 128], expected [64, 256]"
    );
}
