//! The smallest real vocabulary: one token per byte, plus EOS (id 256).

use std::sync::Arc;

use quarry_grammar::Vocabulary;

pub fn byte_vocab() -> Arc<Vocabulary> {
    let toks: Vec<Vec<u8>> = (0..=255u8)
        .map(|b| vec![b])
        .chain([b"<eos>".to_vec()])
        .collect();
    Arc::new(Vocabulary::new(
        toks.iter()
            .enumerate()
            .map(|(i, t)| (t.as_slice(), i == 256)),
        &[256],
    ))
}
