//! With the `cuda` feature, compiles quarry's own kernels (kernels/*.cu) to PTX for `src/cuda/`
//! to embed; without it, does nothing (CI and CPU builds need no CUDA toolchain).
//!
//! nvcc is `$NVCC`, else `$CUDA_ROOT/bin/nvcc`, else `nvcc` on the PATH (`make build-cuda` sets
//! them up, see infra/cuda-env.sh); the target is `compute_$CUDA_COMPUTE_CAP` (default 90), PTX
//! the driver compiles for its GPU at load time.

use std::path::PathBuf;
use std::process::Command;

const KERNELS: [&str; 6] = [
    "gemv_q8",
    "glu",
    "paged_attention",
    "residual",
    "rope_store",
    "sampling",
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
    for name in KERNELS {
        let src = format!("kernels/{name}.cu");
        println!("cargo::rerun-if-changed={src}");
        let ptx = out.join(format!("{name}.ptx"));
        let status = Command::new(&nvcc)
            .args([
                "-ptx",
                "-O3",
                "-std=c++17",
                &format!("-arch=compute_{cap}"),
                "-o",
            ])
            .arg(&ptx)
            .arg(&src)
            .status()
            .unwrap_or_else(|e| {
                panic!("cannot run {} ({e}): see `make build-cuda`", nvcc.display())
            });
        assert!(status.success(), "nvcc failed on {src}");
    }
}
