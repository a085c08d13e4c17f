//! Writes the kernel program as the worker compiles it, for tools without Rust (the GPU host):
//! `cargo run -p backend-cuda --example kernel_program -- <dir> [arch]` writes `<dir>/program.cu`
//! (the parameter structs' definitions, then the kernel files, each part opened by
//! [`backend_cuda::PART_MARK`]) and `<dir>/options.txt` (NVRTC's options, one a line; arch
//! `sm_90` unless given). `scripts/nvrtc-timing.py` and the ptxas reports read them.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().ok_or("usage: kernel_program <dir> [arch]")?);
    let arch = args.next().unwrap_or_else(|| "sm_90".to_owned());
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("program.cu"), backend_cuda::kernel_source())?;
    let options = backend_cuda::compile_options(&arch).join("\n");
    std::fs::write(dir.join("options.txt"), options + "\n")?;
    println!(
        "wrote {}/program.cu and options.txt ({arch})",
        dir.display()
    );
    Ok(())
}
