//! Prints a GGUF file's metadata (arrays summarised) and tensor table.
//!
//! `cargo run -p worker-common --example gguf_dump -- <file.gguf>`

use std::collections::BTreeMap;
use std::process::ExitCode;

use worker_common::gguf::{Gguf, Value};

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: gguf_dump <file.gguf>");
        return ExitCode::from(2);
    };
    let gguf = match Gguf::open(&path) {
        Ok(gguf) => gguf,
        Err(err) => {
            eprintln!("{path}: {err}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "{path}: {} metadata entries, {} tensors, alignment {}, data at {}",
        gguf.metadata_len(),
        gguf.tensor_count(),
        gguf.alignment(),
        gguf.data_offset()
    );
    for (key, value) in gguf.metadata() {
        match value {
            Value::Array(array) => {
                let head: Vec<String> = array.iter().take(4).map(|v| v.to_string()).collect();
                println!("  {key} = {value} [{} …]", head.join(", "));
            }
            Value::String(s) if s.len() > 120 => {
                println!("  {key} = <string of {} bytes>", s.len())
            }
            _ => println!("  {key} = {value}"),
        }
    }
    let mut type_counts = BTreeMap::new();
    for tensor in gguf.tensors() {
        *type_counts.entry(tensor.ggml_type).or_insert(0) += 1;
        println!(
            "  {:<40} {:<6} {:?} @{}",
            tensor.name,
            tensor.ggml_type.name(),
            tensor.shape,
            tensor.offset
        );
    }
    println!("types: {type_counts:?}");
    ExitCode::SUCCESS
}
