//! Helpers shared by the crate's unit tests.

/// Every sequence of at most `max` items from `alphabet`, shortest first (the empty one first):
/// the inputs an exhaustive check of short strings walks.
pub(crate) fn words<T: Clone>(alphabet: &[T], max: usize) -> Vec<Vec<T>> {
    let mut words = vec![Vec::new()];
    let mut last = words.clone();
    for _ in 0..max {
        last = last
            .iter()
            .flat_map(|w| {
                alphabet.iter().map(move |x| {
                    let mut w = w.clone();
                    w.push(x.clone());
                    w
                })
            })
            .collect();
        words.extend(last.iter().cloned());
    }
    words
}
