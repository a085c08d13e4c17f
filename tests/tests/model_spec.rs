//! `ModelSpec` on the four real models: the hyper-parameters of ASSETS.md, and errors that name
//! the tensor when a copy of a model loses or reshapes one.

use llorch_tests::assets::Model;
use worker_common::gguf::Gguf;
use worker_common::model::{Architecture, ModelSpec, QkvLayout, RopeStyle};

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
