use candle_core::Device;
use quarry_model::*;
fn main() {
    let m = Llama::load("models/SmolLM2-135M-Instruct.Q4_1.gguf", &Device::Cpu).unwrap();
    let toks = [504u32, 3575, 282, 4649, 314];
    let mut pool = KvPool::new(m.config(), 16, 4, &Device::Cpu, None).unwrap();
    let mut t = Vec::new(); pool.alloc_into(1, &mut t);
    let mut out = Logits::new();
    m.forward(&[SeqInput::new(&toks, 0, &t).with_all_logits()], &mut pool, &mut out).unwrap();
    for (p, row) in out.positions(0).enumerate() {
        let mut idx: Vec<usize> = (0..row.len()).collect();
        idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        let mx = row[idx[0]] as f64; let lse = mx + row.iter().map(|&x| (x as f64 - mx).exp()).sum::<f64>().ln();
        println!("{p} {:?} {:?} {lse:.4}", &idx[..5], idx[..5].iter().map(|&i| row[i]).collect::<Vec<_>>());
    }
}
