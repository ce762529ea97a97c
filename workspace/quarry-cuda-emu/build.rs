//! Compiles quarry-model's CUDA kernels (`../quarry-model/kernels/*.cu`) as C++ for the CPU, each
//! in its own translation unit after `emu/include/cuda_emu.h` (the device API they use), with the
//! fiber runtime (`emu/runtime.cpp`). Needs a C++20 compiler (g++ 12 or clang 15) on x86-64; no
//! CUDA toolchain.

use std::path::PathBuf;

fn main() {
    let here = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let kernels = here.join("../quarry-model/kernels");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo::rerun-if-changed=emu");
    println!("cargo::rerun-if-changed={}", kernels.display());
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++20")
        .opt_level(2)
        .warnings(false)
        .include(here.join("emu/include"))
        .include(&kernels)
        .define("QUARRY_CPU_EMULATION", None)
        // The GPU's _rn intrinsics round every operation alone; nvcc may contract the rest, the
        // tests' tolerances cover that. Kernels read 16-bit values through vector loads.
        .flag("-ffp-contract=off")
        .flag("-fno-strict-aliasing")
        .flag("-Wno-unknown-pragmas")
        .file(here.join("emu/runtime.cpp"))
        .file(here.join("emu/selftest.cpp"));
    let mut names: Vec<PathBuf> = std::fs::read_dir(&kernels)
        .expect("quarry-model/kernels")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    names.sort();
    for cu in names {
        let stem = cu.file_stem().expect("a file name").to_string_lossy();
        let unit = out.join(format!("{stem}.cpp"));
        std::fs::write(
            &unit,
            format!(
                "#include \"cuda_emu.h\"\n#include \"{}\"\n",
                cu.canonicalize().expect("the kernel's path").display()
            ),
        )
        .expect("write a translation unit");
        build.file(unit);
    }
    build.compile("quarry_cuda_emu");
}
