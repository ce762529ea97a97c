//! Shared set-up for the model tests: the real SmolLM2 and Gemma 3 GGUFs and their llama.cpp
//! fixtures.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use candle_core::Device;
use quarry_model::{KvLayout, KvPool, Llama, Logits, PageId, SeqInput};

/// The repository root: `$QUARRY_ROOT` (for test binaries carried to a GPU machine), else the
/// checkout they were built in.
pub fn root() -> PathBuf {
    std::env::var_os("QUARRY_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

/// The device the model tests run on: `$QUARRY_TEST_DEVICE` (`cuda:0` in a CUDA build), else the
/// CPU.
pub fn device() -> Device {
    static DEVICE: OnceLock<Device> = OnceLock::new();
    DEVICE
        .get_or_init(|| {
            let name = std::env::var("QUARRY_TEST_DEVICE").unwrap_or_else(|_| "cpu".into());
            quarry_model::parse_device(&name).unwrap()
        })
        .clone()
}

/// The model runtime options the tests load with: the defaults, or what the `QUARRY_*`
/// variables of `ModelOptions::VARIABLES` say (a GPU run of another form, as the binary reads
/// them). On a CPU plain weights stay f32 unless a variable says otherwise: the F32 bars are for
/// f32 weights, so a machine short of memory gets a clear refusal rather than the Q8_0 form
/// `auto` would fall back to.
pub fn options() -> quarry_model::ModelOptions {
    let mut o = quarry_model::ModelOptions {
        cpu_weights: quarry_model::CpuWeights::F32,
        ..Default::default()
    };
    o.apply_vars(|k| std::env::var(k).ok())
        .expect("QUARRY_* model options");
    o
}

/// `layout`, except that host-memory pools exist only on the CPU.
pub fn layout_for_device(layout: KvLayout) -> KvLayout {
    if device().is_cpu() {
        layout
    } else {
        KvLayout::Tensor
    }
}

pub fn smollm2_path() -> PathBuf {
    model_path("SmolLM2-135M-Instruct.Q4_1.gguf")
}

pub fn gemma3_path() -> PathBuf {
    model_path("gemma-3-270m-q4_k_m.gguf")
}

pub fn qwen25_path() -> PathBuf {
    model_path("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
}

/// Qwen2.5-Coder 0.5B Instruct, loaded once per test binary.
pub fn qwen25() -> &'static Llama {
    static MODEL: OnceLock<Llama> = OnceLock::new();
    MODEL.get_or_init(|| Llama::load_with(qwen25_path(), &device(), &options()).unwrap())
}

/// Qwen2.5 with every weight dequantized to F32, loaded once per test binary.
pub fn qwen25_f32() -> &'static Llama {
    QWEN25_F32.get_or_init(|| load_f32(&qwen25_path(), "qwen25"))
}

pub fn model_path(file: &str) -> PathBuf {
    let path = root().join("models").join(file);
    assert!(
        path.exists(),
        "{} is missing: run `make setup` (`make test` for models/tiny/) first",
        path.display()
    );
    path
}

/// The model, loaded once per test binary.
pub fn smollm2() -> &'static Llama {
    static MODEL: OnceLock<Llama> = OnceLock::new();
    MODEL.get_or_init(|| Llama::load_with(smollm2_path(), &device(), &options()).unwrap())
}

/// Gemma 3 270M, loaded once per test binary.
pub fn gemma3() -> &'static Llama {
    static MODEL: OnceLock<Llama> = OnceLock::new();
    MODEL.get_or_init(|| Llama::load_with(gemma3_path(), &device(), &options()).unwrap())
}

/// A pool of `pages` pages of `page_size` on the test device.
pub fn pool(page_size: usize, pages: usize, layout: KvLayout) -> KvPool {
    pool_for(smollm2(), page_size, pages, layout)
}

static SMOLLM2_F32: OnceLock<Llama> = OnceLock::new();
static GEMMA3_F32: OnceLock<Llama> = OnceLock::new();
static QWEN25_F32: OnceLock<Llama> = OnceLock::new();

/// The tiny random-weight models (`tests/fixtures/tiny_models.py`), by name.
pub const TINY: [&str; 5] = ["qwen3", "llama3", "gemma3", "mistral", "qwen3-yarn"];
static TINY_MODELS: [OnceLock<Llama>; 5] = [const { OnceLock::new() }; 5];

/// The checkpoint folders `tests/fixtures/checkpoints.py` builds from the GGUFs into
/// `models/checkpoints/` (`make test` runs it), and the fixture each is the model of.
pub const CHECKPOINTS: [(&str, &str); 6] = [
    ("smollm2", "smollm2-f32.logits.json.gz"),
    ("tiny-llama3", "tiny-llama3.logits.json.gz"),
    ("tiny-gemma3", "tiny-gemma3.logits.json.gz"),
    ("tiny-qwen3", "tiny-qwen3.logits.json.gz"),
    ("tiny-mistral", "tiny-mistral.logits.json.gz"),
    ("tiny-qwen3-yarn", "tiny-qwen3-yarn.logits.json.gz"),
];
static CHECKPOINT_MODELS: [OnceLock<Llama>; 6] = [const { OnceLock::new() }; 6];

/// The checkpoint folder `name` (one of [`CHECKPOINTS`]), loaded once per test binary.
pub fn checkpoint(name: &str) -> &'static Llama {
    let k = CHECKPOINTS
        .iter()
        .position(|(n, _)| *n == name)
        .expect("a checkpoint");
    CHECKPOINT_MODELS[k].get_or_init(|| {
        let dir = model_path(&format!("checkpoints/{name}"));
        Llama::load_with(&dir, &device(), &options()).unwrap()
    })
}

/// Whether `model` is one of the F32 copies ([`smollm2_f32`] and the others), a tiny model or a
/// checkpoint (F32 weights too: a checkpoint's are held in f32 on a CPU).
fn is_f32_copy(model: &Llama) -> bool {
    [&SMOLLM2_F32, &GEMMA3_F32, &QWEN25_F32]
        .into_iter()
        .chain(&TINY_MODELS)
        .chain(&CHECKPOINT_MODELS)
        .any(|copy| copy.get().is_some_and(|m| std::ptr::eq(m, model)))
}

/// The tiny model `name` (one of [`TINY`]), as `make test` builds it into `models/tiny/`
/// (infra/setup-test.sh), loaded once per test binary, after checking that it is the file
/// llama.cpp computed its fixture on (`fixture`'s `model_sha256`): the same script with another
/// numpy or gguf could write other weights.
pub fn tiny(name: &str, fixture: &serde_json::Value) -> &'static Llama {
    use sha2::Digest;
    let k = TINY.iter().position(|t| *t == name).expect("a tiny model");
    TINY_MODELS[k].get_or_init(|| {
        let path = model_path(&format!("tiny/tiny-{name}.gguf"));
        let sha = sha2::Sha256::digest(std::fs::read(&path).unwrap());
        let hex: String = sha.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            fixture["model_sha256"].as_str().unwrap(),
            "{} is not the file llama.cpp saw: rebuild it with tests/fixtures/tiny_models.py, or \
             the fixture with gen_model_fixtures.py tiny-{name}",
            path.display()
        );
        Llama::load_with(&path, &device(), &options()).unwrap()
    })
}

/// [`pool`] shaped for `model`. The F32 copies are held to the F32 bar, which is the arithmetic's
/// alone, so their pages are F32 on every device: a GPU's default f16 pages are llama.cpp's f16 KV
/// cache, a change of rounding that the quantized models' bars (llama.cpp's own spread under it)
/// cover. On an H100 (2026-11-26) the F32 SmolLM2 met the F32 bar (0.005) with F32 pages and
/// missed it with f16 pages (worst log-softmax difference 0.038).
pub fn pool_for(model: &Llama, page_size: usize, pages: usize, layout: KvLayout) -> KvPool {
    let layout = Some(layout_for_device(layout));
    let dtype = match is_f32_copy(model) {
        true => candle_core::DType::F32,
        false => quarry_model::kv_dtype(&device(), model.options().kv_dtype),
    };
    KvPool::with_dtype(model.config(), page_size, pages, &device(), layout, dtype).unwrap()
}

/// Runs `tokens` as one prefill of a fresh sequence and returns the logits at every position.
pub fn prefill_all(tokens: &[u32], page_size: usize, layout: KvLayout) -> Vec<Vec<f32>> {
    prefill_all_with(smollm2(), tokens, page_size, layout)
}

/// [`prefill_all`] with `model`.
pub fn prefill_all_with(
    model: &Llama,
    tokens: &[u32],
    page_size: usize,
    layout: KvLayout,
) -> Vec<Vec<f32>> {
    let mut p = pool_for(model, page_size, tokens.len().div_ceil(page_size), layout);
    let mut table: Vec<PageId> = Vec::new();
    assert!(p.alloc_into(p.pages_for(tokens.len()), &mut table));
    let mut out = Logits::new();
    model
        .forward(
            &[SeqInput::new(tokens, 0, &table).with_all_logits()],
            &mut p,
            &mut out,
        )
        .unwrap();
    out.positions(0).map(<[f32]>::to_vec).collect()
}

pub fn log_sum_exp(row: &[f32]) -> f64 {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln()
}

/// The llama.cpp logits fixture (`tests/fixtures/gen_model_fixtures.py`).
pub fn fixture() -> serde_json::Value {
    read_fixture("smollm2.logits.json.gz")
}

pub fn read_fixture(name: &str) -> serde_json::Value {
    let path = root().join("tests/fixtures/model").join(name);
    let file = std::fs::File::open(&path).unwrap();
    serde_json::from_reader(flate2::read::GzDecoder::new(file)).unwrap()
}

/// A JSON array of token ids.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// SmolLM2 with every weight dequantized to F32, loaded once per test binary.
pub fn smollm2_f32() -> &'static Llama {
    SMOLLM2_F32.get_or_init(|| load_f32(&smollm2_path(), "smollm2"))
}

/// Gemma 3 with every weight dequantized to F32, loaded once per test binary.
pub fn gemma3_f32() -> &'static Llama {
    GEMMA3_F32.get_or_init(|| load_f32(&gemma3_path(), "gemma3"))
}

/// `src` with every weight dequantized to F32. candle's GGUF writer puts the copy in a temporary
/// file, which is loaded through quarry's ordinary F32 path and removed.
fn load_f32(src: &std::path::Path, name: &str) -> Llama {
    load_requantized(
        src,
        name,
        candle_core::quantized::GgmlDType::F32,
        &options(),
    )
}

/// `src` with every matrix dequantized and quantized again to `dtype` (its vectors F32), loaded
/// with `o` from a temporary GGUF file (candle's writer), which is removed.
pub fn load_requantized(
    src: &std::path::Path,
    name: &str,
    dtype: candle_core::quantized::GgmlDType,
    o: &quarry_model::ModelOptions,
) -> Llama {
    use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
    let mut file = std::fs::File::open(src).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let cpu = Device::Cpu;
    let tensors: Vec<(String, QTensor)> = content
        .tensor_infos
        .keys()
        .map(|name| {
            let t = content.tensor(&mut file, name, &cpu).unwrap();
            let dense = t.dequantize(&cpu).unwrap();
            let to = if dense.rank() == 2 {
                dtype
            } else {
                GgmlDType::F32
            };
            (name.clone(), QTensor::quantize(&dense, to).unwrap())
        })
        .collect();
    // LLAMA_FTYPE_ALL_F32, LLAMA_FTYPE_MOSTLY_Q8_0.
    let file_type = gguf_file::Value::U32(if dtype == GgmlDType::Q8_0 { 7 } else { 0 });
    let metadata: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| {
            if k == "general.file_type" {
                (k.as_str(), &file_type)
            } else {
                (k.as_str(), v)
            }
        })
        .collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let path = std::env::temp_dir().join(format!(
        "quarry-{name}-{dtype:?}-{}.gguf",
        std::process::id()
    ));
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    gguf_file::write(&mut out, &metadata, &tensor_refs).unwrap();
    drop(out);
    let model = Llama::load_with(&path, &device(), o);
    std::fs::remove_file(&path).unwrap();
    model.unwrap()
}

/// The llama.cpp logits fixture of the F32 copy of SmolLM2 (`tests/fixtures/gen_model_fixtures.py`).
pub fn fixture_f32() -> serde_json::Value {
    read_fixture("smollm2-f32.logits.json.gz")
}
