//! Compiles the kernel program ahead of time, when the build is given an NVRTC library:
//! `LLORCH_NVRTC=<path of libnvrtc.so>` (the CUDA toolkit's, or the `nvidia-cuda-nvrtc` wheel's
//! from PyPI) compiles `src/program.rs`'s program for each architecture of `LLORCH_CUDA_ARCHS`
//! (default `sm_80,sm_86,sm_89,sm_90`), in parallel, and embeds the cubins in the binary, so a
//! new host starts without compiling (specs/CUDA.md, "Cold start"). Without `LLORCH_NVRTC` nothing
//! is embedded and the worker compiles at start-up as before: the build needs no CUDA toolkit.

use std::ffi::{CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};

include!("src/program.rs");

/// Architectures compiled when `LLORCH_CUDA_ARCHS` is not set: Ampere, Ada and Hopper.
const DEFAULT_ARCHS: &str = "sm_80,sm_86,sm_89,sm_90";

fn main() -> Result<(), String> {
    println!("cargo:rerun-if-env-changed=LLORCH_NVRTC");
    println!("cargo:rerun-if-env-changed=LLORCH_CUDA_ARCHS");
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-changed=src/program.rs");
    println!("cargo:rerun-if-changed=src/params.rs");
    println!("cargo:rerun-if-changed=src/formats.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    let embedded = match std::env::var_os("LLORCH_NVRTC") {
        Some(library) => compile_all(Path::new(&library), &out)?,
        None => Vec::new(),
    };
    let entries: String = embedded
        .iter()
        .map(|(arch, version)| {
            format!(
                "    EmbeddedCubin {{ arch: {arch:?}, nvrtc: {version:?}, cubin: include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{arch}.cubin\")) }},\n"
            )
        })
        .collect();
    let table = format!("&[\n{entries}]\n");
    std::fs::write(out.join("embedded.rs"), table).map_err(|e| format!("writing embedded.rs: {e}"))
}

/// Compiles the program for every architecture asked for, one thread each; returns each
/// architecture with the NVRTC version that compiled it.
fn compile_all(library: &Path, out: &Path) -> Result<Vec<(String, String)>, String> {
    let nvrtc = Nvrtc::open(library)?;
    let version = nvrtc.version()?;
    let archs = std::env::var("LLORCH_CUDA_ARCHS").unwrap_or_else(|_| DEFAULT_ARCHS.to_owned());
    let archs: Vec<&str> = archs
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    let source = source();
    let compiled: Vec<Result<Vec<u8>, String>> = std::thread::scope(|scope| {
        let threads: Vec<_> = archs
            .iter()
            .map(|arch| scope.spawn(|| nvrtc.compile(&source, &compile_options(arch))))
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err("a compile thread panicked".to_owned()))
            })
            .collect()
    });
    let mut embedded = Vec::new();
    for (arch, cubin) in archs.iter().zip(compiled) {
        let cubin = cubin.map_err(|e| format!("compiling the kernels for {arch}: {e}"))?;
        std::fs::write(out.join(format!("{arch}.cubin")), cubin)
            .map_err(|e| format!("writing the {arch} cubin: {e}"))?;
        println!("cargo:warning=embedded the kernels compiled for {arch} by NVRTC {version}");
        embedded.push(((*arch).to_owned(), version.clone()));
    }
    Ok(embedded)
}

type CreateProgram = unsafe extern "C" fn(
    *mut *mut c_void,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type CompileProgram = unsafe extern "C" fn(*mut c_void, c_int, *const *const c_char) -> c_int;
type GetSize = unsafe extern "C" fn(*mut c_void, *mut usize) -> c_int;
type GetBytes = unsafe extern "C" fn(*mut c_void, *mut c_char) -> c_int;
type DestroyProgram = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
type Version = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;

/// The few NVRTC entry points the build needs, from the library named by `LLORCH_NVRTC`.
struct Nvrtc {
    create: CreateProgram,
    compile: CompileProgram,
    log_size: GetSize,
    log: GetBytes,
    cubin_size: GetSize,
    cubin: GetBytes,
    destroy: DestroyProgram,
    version: Version,
    _library: libloading::Library,
}

impl Nvrtc {
    fn open(path: &Path) -> Result<Self, String> {
        // SAFETY: loading libnvrtc runs its initialisers, which have no preconditions.
        let library = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("LLORCH_NVRTC={}: {e}", path.display()))?;
        // SAFETY: each symbol is NVRTC's C entry point of that name, with the signature of its
        // type (nvrtc.h); the pointers are used only while `_library` keeps it loaded.
        unsafe {
            Ok(Self {
                create: *symbol(&library, b"nvrtcCreateProgram\0")?,
                compile: *symbol(&library, b"nvrtcCompileProgram\0")?,
                log_size: *symbol(&library, b"nvrtcGetProgramLogSize\0")?,
                log: *symbol(&library, b"nvrtcGetProgramLog\0")?,
                cubin_size: *symbol(&library, b"nvrtcGetCUBINSize\0")?,
                cubin: *symbol(&library, b"nvrtcGetCUBIN\0")?,
                destroy: *symbol(&library, b"nvrtcDestroyProgram\0")?,
                version: *symbol(&library, b"nvrtcVersion\0")?,
                _library: library,
            })
        }
    }

    /// `major.minor`, as the worker's cache key and logs write it.
    fn version(&self) -> Result<String, String> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: both pointers are valid for writes.
        check("nvrtcVersion", unsafe {
            (self.version)(&mut major, &mut minor)
        })?;
        Ok(format!("{major}.{minor}"))
    }

    fn compile(&self, source: &str, options: &[String]) -> Result<Vec<u8>, String> {
        let source = CString::new(source).map_err(|e| e.to_string())?;
        let options: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        let pointers: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let count = c_int::try_from(pointers.len()).map_err(|e| e.to_string())?;
        let mut program = std::ptr::null_mut();
        // SAFETY: the strings are NUL-terminated and outlive the call; no headers are passed.
        let created = unsafe {
            (self.create)(
                &mut program,
                source.as_ptr(),
                c"llorch_kernels.cu".as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        check("nvrtcCreateProgram", created)?;
        // SAFETY: `program` was created above; `pointers` holds `count` live option strings.
        let compiled = unsafe { (self.compile)(program, count, pointers.as_ptr()) };
        let result = match compiled {
            0 => self.bytes(program, self.cubin_size, self.cubin),
            status => Err(format!(
                "nvrtcCompileProgram: status {status}\n{}",
                String::from_utf8_lossy(&self.bytes(program, self.log_size, self.log)?)
            )),
        };
        // SAFETY: `program` is live and destroyed once, here.
        check("nvrtcDestroyProgram", unsafe {
            (self.destroy)(&mut program)
        })?;
        result
    }

    /// A compiled program's cubin or log, through its size and copy entry points.
    fn bytes(
        &self,
        program: *mut c_void,
        size: GetSize,
        copy: GetBytes,
    ) -> Result<Vec<u8>, String> {
        let mut len = 0;
        // SAFETY: `program` is live and `len` valid for writes.
        check("size", unsafe { size(program, &mut len) })?;
        let mut bytes = vec![0u8; len];
        // SAFETY: `bytes` has the `len` bytes NVRTC said it writes.
        check("copy", unsafe { copy(program, bytes.as_mut_ptr().cast()) })?;
        Ok(bytes)
    }
}

/// SAFETY: the caller states that `name` is a symbol of type `T`.
unsafe fn symbol<'l, T>(
    library: &'l libloading::Library,
    name: &[u8],
) -> Result<libloading::Symbol<'l, T>, String> {
    // SAFETY: forwarded from the caller.
    unsafe { library.get(name) }.map_err(|e| format!("{}: {e}", String::from_utf8_lossy(name)))
}

fn check(call: &str, status: c_int) -> Result<(), String> {
    match status {
        0 => Ok(()),
        status => Err(format!("{call}: NVRTC status {status}")),
    }
}
