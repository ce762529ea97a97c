//! With the `cuda` feature, compiles quarry's own kernels (kernels/*.cu) to PTX for `src/cuda/`
//! to embed; without it, does nothing (CI and CPU builds need no CUDA toolchain).
//!
//! nvcc is `$NVCC`, else `$CUDA_ROOT/bin/nvcc`, else `nvcc` on the PATH (`make build-cuda` sets
//! them up, see infra/cuda-env.sh); the target is `compute_$CUDA_COMPUTE_CAP` (default 90), PTX
//! the driver compiles for its GPU at load time, a module at a time. The attention kernel's
//! forms are compiled into a module per pool type (`paged_attention_f16.ptx`, …), so that a
//! process compiles the forms of its pool type alone.

use std::path::PathBuf;
use std::process::Command;

/// The modules: the source's name, the module's, and the macros it is compiled with.
const MODULES: [(&str, &str, &[&str]); 8] = [
    ("gemv_q8", "gemv_q8", &[]),
    ("glu", "glu", &[]),
    ("paged_attention", "paged_attention_f32", &POOLS[0]),
    ("paged_attention", "paged_attention_f16", &POOLS[1]),
    ("paged_attention", "paged_attention_bf16", &POOLS[2]),
    ("residual", "residual", &[]),
    ("rope_store", "rope_store", &[]),
    ("sampling", "sampling", &[]),
];

/// The attention's pool types, one module each (kernels/paged_attention.cu's `QUARRY_POOL_*`).
const POOLS: [[&str; 3]; 3] = [
    [
        "-DQUARRY_POOL_F32=1",
        "-DQUARRY_POOL_F16=0",
        "-DQUARRY_POOL_BF16=0",
    ],
    [
        "-DQUARRY_POOL_F32=0",
        "-DQUARRY_POOL_F16=1",
        "-DQUARRY_POOL_BF16=0",
    ],
    [
        "-DQUARRY_POOL_F32=0",
        "-DQUARRY_POOL_F16=0",
        "-DQUARRY_POOL_BF16=1",
    ],
];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=CARGO_FEATURE_CUDA");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    for var in ["NVCC", "CUDA_ROOT", "CUDA_COMPUTE_CAP"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    let nvcc = std::env::var_os("NVCC")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("CUDA_ROOT")
                .map(|root| PathBuf::from(root).join("bin/nvcc"))
                .unwrap_or_else(|| "nvcc".into())
        });
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo::rerun-if-changed=kernels/common.cuh");
    for (name, module, defines) in MODULES {
        let src = format!("kernels/{name}.cu");
        println!("cargo::rerun-if-changed={src}");
        let ptx = out.join(format!("{module}.ptx"));
        let status = Command::new(&nvcc)
            .args(["-ptx", "-O3", "-std=c++17", &format!("-arch=compute_{cap}")])
            .args(defines)
            .arg("-o")
            .arg(&ptx)
            .arg(&src)
            .status()
            .unwrap_or_else(|e| {
                panic!("cannot run {} ({e}): see `make build-cuda`", nvcc.display())
            });
        assert!(status.success(), "nvcc failed on {src}");
    }
}
