//! With the `cuda` feature, compiles quarry's own kernels (kernels/*.cu) to PTX for `src/cuda/`
//! to embed; without it, does nothing (CI and CPU builds need no CUDA toolchain).
//!
//! nvcc is `$NVCC`, else `$CUDA_ROOT/bin/nvcc`, else `nvcc` on the PATH (`make build-cuda` sets
//! them up, see infra/cuda-env.sh); the target is `compute_$CUDA_COMPUTE_CAP` (default 90), PTX
//! the driver compiles for its GPU at load time, a module at a time. The attention kernel's
//! forms are compiled into a module per pool type (`paged_attention_f16.ptx`, …), so that a
//! process compiles the forms of its pool type alone, and the 8-bit GEMV's into a module per
//! room (`gemv_q8_r1.ptx`, …).

use std::path::PathBuf;
use std::process::Command;

/// Sources compiled into a module each.
const PLAIN: [&str; 4] = ["glu", "residual", "rope_store", "sampling"];
/// The 8-bit GEMV's rooms (the rows a form has room for): a module of each one's forms
/// (kernels/gemv_q8.cu's `QUARRY_GEMV_ROOM`).
const GEMV_ROOMS: [u8; 4] = [1, 2, 4, 8];
/// The attention's pool types: a module of each one's one-token forms, one of its tiled forms and
/// one of its cascade prefix forms (kernels/paged_attention.cu's `QUARRY_POOL_*`, `QUARRY_TILED`
/// and `QUARRY_PREFIX`).
const POOLS: [&str; 3] = ["f32", "f16", "bf16"];

/// Every module: its source's name, its own, and the macros it is compiled with.
fn modules() -> Vec<(&'static str, String, Vec<String>)> {
    let mut all: Vec<_> = PLAIN.map(|n| (n, n.to_owned(), Vec::new())).into();
    for room in GEMV_ROOMS {
        all.push((
            "gemv_q8",
            format!("gemv_q8_r{room}"),
            vec![format!("-DQUARRY_GEMV_ROOM={room}")],
        ));
    }
    for kind in ["", "tiled_", "prefix_"] {
        for pool in POOLS {
            let mut defines: Vec<String> = POOLS
                .map(|p| format!("-DQUARRY_POOL_{}={}", p.to_uppercase(), u8::from(p == pool)))
                .into();
            defines.push(format!("-DQUARRY_TILED={}", u8::from(kind == "tiled_")));
            defines.push(format!("-DQUARRY_PREFIX={}", u8::from(kind == "prefix_")));
            all.push((
                "paged_attention",
                format!("paged_attention_{kind}{pool}"),
                defines,
            ));
        }
    }
    all
}

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
    // Every module's nvcc at once (the attention's six take most of the time), then each
    // one's outcome.
    let runs: Vec<_> = modules()
        .into_iter()
        .map(|(name, module, defines)| {
            let src = format!("kernels/{name}.cu");
            println!("cargo::rerun-if-changed={src}");
            let ptx = out.join(format!("{module}.ptx"));
            let child = Command::new(&nvcc)
                .args(["-ptx", "-O3", "-std=c++17", &format!("-arch=compute_{cap}")])
                .args(&defines)
                .arg("-o")
                .arg(&ptx)
                .arg(&src)
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot run {} ({e}): see `make build-cuda`", nvcc.display())
                });
            (module, child)
        })
        .collect();
    for (module, mut child) in runs {
        let status = child.wait().expect("nvcc runs");
        assert!(status.success(), "nvcc failed on the module {module}");
    }
}
