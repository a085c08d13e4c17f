//! Measures encoding throughput of a GGUF file's tokenizer on 1 MiB of mixed text (prose, code,
//! CJK, emoji, Arabic, whitespace runs), and checks that decoding gives the text back.
//!
//! Two texts: `mixed` repeats the samples, so words recur as in real prose (the encoder merges
//! each distinct word once per call); `unique` is pseudo-random words that almost never recur,
//! the worst case, which measures the merge loop itself.
//!
//! A 4 MiB mixed text checks that time grows linearly with length. When `LLORCH_BENCH_TEXT_DIR`
//! is set, the texts are also written there (`mixed.txt`, `unique.txt`) so that
//! `scripts/bench-tokenizer.sh` can time llama.cpp on the same bytes.
//!
//! `cargo run --release -p worker-common --example tokenize_bench -- <file.gguf> [rounds]`

use std::process::ExitCode;
use std::time::Instant;

use worker_common::gguf::Gguf;
use worker_common::tokenizer::Tokenizer;

/// The pieces the benchmark text repeats; about 40% ASCII prose, 30% code, 30% other scripts.
const SAMPLES: &[&str] = &[
    "The quick brown fox jumps over the lazy dog. It's 2024, and we'll see 3.14159 or 1,000,000 \
     of them; don't they? Language models read text as tokens, not characters.\n\n",
    "fn main() {\n    let mut total: u64 = 0;\n    for (i, x) in data.iter().enumerate() {\n        \
     total += (*x as u64) << (i % 8);\n    }\n\tprintln!(\"{total:#x}\");\n}\r\n",
    "def tokenize(text: str) -> list[int]:\n    return [ord(c) for c in text if c.isprintable()]\n",
    "中文字符和日本語のテキスト、그리고 한국어 텍스트。机器学习模型。\n",
    "emoji 🦙🔥 👩‍👩‍👧‍👦 🇫🇷 ❤️ — naïve café résumé Ελληνικά Русский текст\n",
    "مرحبا بالعالم، هذا نص عربي ١٢٣ للاختبار.\n",
    "    indented    with   runs\t\tof   whitespace   \n\n\n",
];

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: tokenize_bench <file.gguf> [rounds]");
        return ExitCode::from(2);
    };
    let rounds: u32 = args.next().and_then(|r| r.parse().ok()).unwrap_or(5);
    let load = Instant::now();
    let tokenizer = match Gguf::open(&path)
        .map_err(|e| e.to_string())
        .and_then(|g| Tokenizer::from_gguf(&g).map_err(|e| e.to_string()))
    {
        Ok(tokenizer) => tokenizer,
        Err(err) => {
            eprintln!("{path}: {err}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "{path}: loaded in {:.0} ms",
        load.elapsed().as_secs_f64() * 1e3
    );
    let text_dir = std::env::var_os("LLORCH_BENCH_TEXT_DIR").map(std::path::PathBuf::from);
    for (label, text) in [
        ("mixed", mixed_text(1 << 20)),
        ("unique", unique_words(1 << 20)),
        ("mixed-4MiB", mixed_text(4 << 20)),
    ] {
        if let Some(dir) = &text_dir
            && let Err(err) = std::fs::write(dir.join(format!("{label}.txt")), &text)
        {
            eprintln!("cannot write the {label} text to {}: {err}", dir.display());
            return ExitCode::FAILURE;
        }
        let ids = match tokenizer.encode(&text, false, false) {
            Ok(ids) => ids,
            Err(err) => {
                eprintln!("{path}: {label}: {err}");
                return ExitCode::FAILURE;
            }
        };
        if tokenizer.decode(&ids) != text {
            eprintln!("{path}: {label}: decoding the encoding does not give the text back");
            return ExitCode::FAILURE;
        }
        let mut best = f64::INFINITY;
        for _ in 0..rounds.max(1) {
            let start = Instant::now();
            let _ = std::hint::black_box(tokenizer.encode(&text, false, false));
            best = best.min(start.elapsed().as_secs_f64());
        }
        let mb = text.len() as f64 / 1e6;
        println!(
            "{path}: {} ({}), {label}: {mb:.2} MB -> {} tokens, best of {rounds}: {:.1} ms = {:.1} MB/s",
            tokenizer.kind().as_str(),
            tokenizer.vocab().pre(),
            ids.len(),
            best * 1e3,
            mb / best
        );
    }
    ExitCode::SUCCESS
}

/// At least `bytes` bytes of the samples, cycled.
fn mixed_text(bytes: usize) -> String {
    let mut text = String::with_capacity(bytes + 256);
    for sample in SAMPLES.iter().cycle() {
        if text.len() >= bytes {
            break;
        }
        text.push_str(sample);
    }
    text
}

/// At least `bytes` bytes of pseudo-random lowercase words, digits and punctuation.
fn unique_words(bytes: usize) -> String {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: u64| {
        // xorshift64: deterministic, so runs are comparable.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let mut text = String::with_capacity(bytes + 64);
    while text.len() < bytes {
        text.push(' ');
        for _ in 0..2 + next(9) {
            text.push(char::from(b'a' + next(26) as u8));
        }
        match next(10) {
            0 => text.push_str(", "),
            1 => text.push_str(&next(100_000).to_string()),
            2 => text.push_str(".\n"),
            _ => {}
        }
    }
    text
}
