use candle_core::Device;
use quarry_model::*;
use std::time::Instant;
fn main() {
    let m = Llama::load("models/SmolLM2-135M-Instruct.Q4_1.gguf", &Device::Cpu).unwrap();
    let layout = if std::env::var("TENSOR").is_ok() { KvLayout::Tensor } else { KvLayout::Host };
    for n in [128usize, 512, 1100] {
        let toks: Vec<u32> = (0..n as u32).map(|i| (i * 37) % 49000 + 10).collect();
        let mut pool = KvPool::new(m.config(), 16, n.div_ceil(16) + 8, &Device::Cpu, Some(layout)).unwrap();
        let mut t = Vec::new(); pool.alloc_into(pool.num_pages(), &mut t);
        let mut out = Logits::new();
        let s = Instant::now();
        m.forward(&[SeqInput::new(&toks, 0, &t)], &mut pool, &mut out).unwrap();
        let pre = s.elapsed().as_secs_f64();
        let s = Instant::now();
        for i in 0..32 { let tok=[5u32+i]; m.forward(&[SeqInput::new(&tok, n + i as usize, &t)], &mut pool, &mut out).unwrap(); }
        let dec = s.elapsed().as_secs_f64() / 32.0;
        println!("n={n} prefill {:.3}s ({:.0} tok/s) decode {:.2} ms/tok", pre, n as f64 / pre, dec * 1e3);
    }
}
