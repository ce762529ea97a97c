//! The vocabulary as plain data, and the byte trie that token masks are computed over.

use crate::loops::LoopCache;

/// Token id → bytes, plus which ids are special and which end a sequence. Built by the caller (for
/// example from `quarry_tokenizer::Tokenizer::token_table`); this crate knows nothing of tokenizers.
///
/// Building one also builds the byte trie of its tokens that every mask walk uses, so build it once
/// per model and share it (`Arc`) across all constraints compiled for that model.
#[derive(Debug, Clone)]
pub struct Vocabulary {
    bytes: Vec<u8>,
    offsets: Vec<u32>,
    special: Vec<bool>,
    eos: Vec<u32>,
    trie: TokenTrie,
    text: TextSlice,
    /// Built on first use ([`Vocabulary::json_ends`]).
    json_ends: std::sync::OnceLock<JsonEnds>,
    /// Loop regions of the tries, built on first use ([`crate::loops`]).
    loops: LoopCache,
    /// The lengths of [`Vocabulary::short_mask`], ascending: [`SHORT_LEVELS`] below the
    /// longest token, then the longest token's length.
    short_levels: Box<[usize]>,
    /// Per level: the tokens of the trie no longer than it, built on first use.
    short_masks: Box<[std::sync::OnceLock<Box<[u32]>>]>,
}

/// The lengths at which a mask can be split by token length ([`Vocabulary::short_mask`]). A few
/// levels, not every length, so that states a few counts apart widen to the same state and
/// share its mask, and the vocabulary keeps a dozen masks at most (about 400 KB at 262k
/// tokens). Below 4 bytes most of a vocabulary is longer, and a split saves little.
const SHORT_LEVELS: [usize; 11] = [4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128];

/// A level is kept only where at most one token in this many is longer: the longer ones are
/// walked node by node, without the whole-subtree shortcuts, so where they are many a plain walk
/// costs less.
const LONG_SHARE: usize = 64;

/// The tokens whose bytes can end a JSON value, for the `uniqueItems` check
/// ([`crate::schema::unique`]): inside a string only `"` or `\` can; elsewhere a structural byte
/// or whitespace. Other tokens are never tried.
#[derive(Debug, Clone)]
pub(crate) struct JsonEnds {
    pub(crate) in_string: Box<[u32]>,
    pub(crate) outside: Box<[u32]>,
}

/// The tokens that are plain text (llguidance calls such a precomputed set a slice): UTF-8 of
/// characters from U+0020 up but `"`, `\\` and DEL, possibly ending in the first bytes of a
/// character (byte-level BPE splits characters). In a JSON string, and in any state that every
/// such character leads back to, all of them are allowed (but those holding a few excepted
/// bytes), so a mask walk there adds this set at once and walks only `rest`, the trie of the
/// other tokens. At 152k tokens the slice holds most of the vocabulary. Control characters
/// (tab, LF) stay out: a JSON string refuses them, and the walk of `rest` prunes them at once.
#[derive(Debug, Clone, Default)]
pub(crate) struct TextSlice {
    pub(crate) mask: Box<[u32]>,
    pub(crate) rest: TokenTrie,
    /// Tokens in the slice.
    pub(crate) len: usize,
    /// For each ASCII byte, the slice's tokens that contain it: a state where a few such bytes
    /// do not loop (`'` in a SQL string, `,` in a CSV field) takes the slice but these, which it
    /// checks one by one.
    pub(crate) containing: Box<[Box<[u32]>]>,
    /// The slice's tokens by their length in characters (a character begun at the end counts),
    /// shortest first.
    by_chars: Box<[u32]>,
    /// Per length in characters `c`: how many of `by_chars` have at most `c`; its last entry is
    /// the longest token's length, past which every token counts.
    chars_end: Box<[u32]>,
    /// Per length in characters below the longest: the tokens of at most that many characters,
    /// as a mask, built on first use ([`TextSlice::within`]).
    within: Box<[std::sync::OnceLock<Box<[u32]>>]>,
}

impl TextSlice {
    /// The slice's tokens of at most `chars` characters (a character begun at the end counts),
    /// as a mask: the slice itself from its longest token's length up. Below it one mask per
    /// length, built on first use (at most the longest token's length of them: about 19 KB
    /// each at 152k tokens).
    pub(crate) fn within(&self, chars: usize) -> &[u32] {
        let Some(cell) = self.within.get(chars) else {
            return &self.mask;
        };
        cell.get_or_init(|| {
            let mut mask = vec![0u32; self.mask.len()].into_boxed_slice();
            for &t in &self.by_chars[..self.chars_end[chars] as usize] {
                mask[t as usize / 32] |= 1 << (t % 32);
            }
            mask
        })
    }

    /// The slice's tokens of more than `chars` characters.
    pub(crate) fn longer_than(&self, chars: usize) -> &[u32] {
        let from = self
            .chars_end
            .get(chars)
            .map_or(self.by_chars.len(), |&e| e as usize);
        &self.by_chars[from..]
    }

    /// The length in characters of the slice's longest token.
    pub(crate) fn longest_chars(&self) -> usize {
        self.within.len()
    }
}

/// The length in characters of plain text ([`is_plain_text`]), counting a character begun at
/// the end.
fn text_chars(bytes: &[u8]) -> usize {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.chars().count(),
        Err(e) => {
            let whole =
                std::str::from_utf8(&bytes[..e.valid_up_to()]).map_or(0, |s| s.chars().count());
            whole + 1
        }
    }
}

/// The ASCII bytes plain text may hold: `0x20..=0x7E` but `"` and `\\`.
pub(crate) fn plain_ascii() -> impl Iterator<Item = u8> {
    (0x20u8..=0x7E).filter(|&b| b != b'"' && b != b'\\')
}

/// Whether `bytes` is plain text for [`TextSlice`].
fn is_plain_text(bytes: &[u8]) -> bool {
    let ok = |s: &str| {
        s.chars()
            .all(|c| c >= ' ' && c != '"' && c != '\\' && c != '\x7f')
    };
    match std::str::from_utf8(bytes) {
        Ok(s) => !s.is_empty() && ok(s),
        // Valid up to an incomplete character at the end.
        Err(e) if e.error_len().is_none() => {
            ok(std::str::from_utf8(&bytes[..e.valid_up_to()]).expect("valid up to here"))
        }
        Err(_) => false,
    }
}

impl Vocabulary {
    /// `tokens[i]` is `(bytes, is_special)` for id `i`; `eos` are the ids that end a sequence (they
    /// are allowed exactly where the constraint accepts). Special tokens are never allowed otherwise.
    pub fn new<'a>(tokens: impl IntoIterator<Item = (&'a [u8], bool)>, eos: &[u32]) -> Self {
        let mut v = Vocabulary {
            bytes: Vec::new(),
            offsets: vec![0],
            special: Vec::new(),
            eos: Vec::new(),
            trie: TokenTrie::default(),
            text: TextSlice::default(),
            json_ends: std::sync::OnceLock::new(),
            loops: LoopCache::default(),
            short_levels: Box::default(),
            short_masks: Box::default(),
        };
        for (b, special) in tokens {
            v.bytes.extend_from_slice(b);
            v.offsets.push(v.bytes.len() as u32);
            v.special.push(special);
        }
        v.eos = eos
            .iter()
            .copied()
            .filter(|&e| (e as usize) < v.special.len())
            .collect();
        v.eos.sort_unstable();
        v.eos.dedup();
        v.trie = TokenTrie::new(&v, |_| true);
        let longest = v.trie.max_depth;
        let mut by_length = vec![0usize; longest + 1];
        for n in &v.trie.nodes {
            by_length[n.depth as usize] += (n.tokens_end - n.tokens_start) as usize;
        }
        let longer = |h: usize| by_length[h + 1..].iter().sum::<usize>();
        v.short_levels = SHORT_LEVELS
            .iter()
            .copied()
            .filter(|&h| h < longest && longer(h) * LONG_SHARE <= v.trie.token_ids.len())
            .chain((longest > 0).then_some(longest))
            .collect();
        v.short_masks = v
            .short_levels
            .iter()
            .map(|_| std::sync::OnceLock::new())
            .collect();
        let mut mask = vec![0u32; v.mask_words()].into_boxed_slice();
        for id in 0..v.len() as u32 {
            if !v.is_special(id) && is_plain_text(v.token_bytes(id).unwrap()) {
                mask[id as usize / 32] |= 1 << (id % 32);
            }
        }
        let rest = TokenTrie::new(&v, |id| mask[id as usize / 32] >> (id % 32) & 1 == 0);
        let mut containing: Vec<Vec<u32>> = vec![Vec::new(); 0x80];
        let mut len = 0;
        let mut by_chars: Vec<(usize, u32)> = Vec::new();
        for id in 0..v.len() as u32 {
            if mask[id as usize / 32] >> (id % 32) & 1 == 1 {
                len += 1;
                by_chars.push((text_chars(v.token_bytes(id).unwrap()), id));
                let mut seen = 0u128;
                for &b in v.token_bytes(id).unwrap() {
                    if b < 0x80 && seen >> b & 1 == 0 {
                        seen |= 1 << b;
                        containing[b as usize].push(id);
                    }
                }
            }
        }
        by_chars.sort_unstable();
        let longest_chars = by_chars.last().map_or(0, |&(c, _)| c);
        let chars_end = (0..=longest_chars)
            .map(|c| by_chars.partition_point(|&(n, _)| n <= c) as u32)
            .collect();
        v.text = TextSlice {
            mask,
            rest,
            len,
            containing: containing.into_iter().map(Vec::into_boxed_slice).collect(),
            by_chars: by_chars.iter().map(|&(_, id)| id).collect(),
            chars_end,
            within: (0..longest_chars)
                .map(|_| std::sync::OnceLock::new())
                .collect(),
        };
        v
    }

    pub(crate) fn trie(&self) -> &TokenTrie {
        &self.trie
    }

    /// The lengths [`Vocabulary::short_mask`] is kept for, ascending; the last is the longest
    /// token's (every token of the trie).
    pub(crate) fn short_levels(&self) -> &[usize] {
        &self.short_levels
    }

    /// The tokens of the trie (no special token) of at most `short_levels()[level]` bytes, as a
    /// mask, built on first use.
    pub(crate) fn short_mask(&self, level: usize) -> &[u32] {
        self.short_masks[level].get_or_init(|| {
            let h = self.short_levels[level];
            let mut mask = vec![0u32; self.mask_words()].into_boxed_slice();
            for n in self.trie.nodes.iter().filter(|n| n.depth as usize <= h) {
                for &t in &self.trie.token_ids[n.tokens_start as usize..n.tokens_end as usize] {
                    mask[t as usize / 32] |= 1 << (t % 32);
                }
            }
            mask
        })
    }

    pub(crate) fn loops(&self) -> &LoopCache {
        &self.loops
    }

    pub(crate) fn text(&self) -> &TextSlice {
        &self.text
    }

    pub(crate) fn json_ends(&self) -> &JsonEnds {
        self.json_ends.get_or_init(|| {
            let mut in_string = vec![0u32; self.mask_words()].into_boxed_slice();
            let mut outside = in_string.clone();
            for id in 0..self.len() as u32 {
                let bytes = self.token_bytes(id).unwrap_or(&[]);
                let bit = 1 << (id % 32);
                if bytes.iter().any(|b| matches!(b, b'"' | b'\\')) {
                    in_string[id as usize / 32] |= bit;
                }
                if bytes.iter().any(|b| b"\"\\,]}[{ \t\n\r".contains(b)) {
                    outside[id as usize / 32] |= bit;
                }
            }
            JsonEnds { in_string, outside }
        })
    }

    /// The fewest tokens that spell `bytes` exactly (special tokens never), or `None` where some
    /// byte starts no token. A shortest path over the positions of `bytes`, each step a token
    /// found by walking the byte trie: O(len × longest token). Used for the budget's completions
    /// ([`crate::budget`]), which are short.
    pub(crate) fn fewest_tokens(&self, bytes: &[u8]) -> Option<Vec<u32>> {
        let n = bytes.len();
        let nodes = &self.trie.nodes;
        // best[i]: (tokens to spell bytes[i..], the first one's end, its id).
        let mut best: Vec<(u32, usize, u32)> = vec![(u32::MAX, 0, 0); n + 1];
        best[n] = (0, n, 0);
        for i in (0..n).rev() {
            let mut node = 0usize;
            for (j, &b) in bytes.iter().enumerate().skip(i) {
                // The child of `node` for byte `b`: children follow their parent in preorder,
                // each after the previous one's subtree.
                let mut child = node + 1;
                let end = nodes[node].subtree_end as usize;
                while child < end && nodes[child].byte != b {
                    child = nodes[child].subtree_end as usize;
                }
                if child >= end {
                    break;
                }
                node = child;
                let here = &nodes[node];
                let rest = best[j + 1].0;
                if here.tokens_end > here.tokens_start && rest != u32::MAX && rest + 1 < best[i].0 {
                    let id = self.trie.token_ids[here.tokens_start as usize];
                    best[i] = (rest + 1, j + 1, id);
                }
            }
        }
        if best[0].0 == u32::MAX {
            return None;
        }
        let mut out = Vec::with_capacity(best[0].0 as usize);
        let mut i = 0;
        while i < n {
            out.push(best[i].2);
            i = best[i].1;
        }
        Some(out)
    }

    pub fn len(&self) -> usize {
        self.special.len()
    }

    pub fn is_empty(&self) -> bool {
        self.special.is_empty()
    }

    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        (i < self.special.len())
            .then(|| &self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize])
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    pub fn eos(&self) -> &[u32] {
        &self.eos
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos.binary_search(&id).is_ok()
    }

    /// Mask length in `u32` words.
    pub fn mask_words(&self) -> usize {
        self.len().div_ceil(32)
    }
}

/// A byte trie of the non-special tokens, stored in preorder so a walk can skip a subtree in one
/// step. A subtree's tokens are contiguous in `token_ids`, so a subtree known to be allowed as a
/// whole is added without walking it.
#[derive(Debug, Clone, Default)]
pub(crate) struct TokenTrie {
    pub(crate) nodes: Vec<Node>,
    /// Token ids in preorder of their nodes.
    pub(crate) token_ids: Vec<u32>,
    /// The longest token, in bytes (the deepest node).
    pub(crate) max_depth: usize,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Node {
    /// Byte groups ([`byte_group`]) of every byte below this node (not its own byte).
    pub(crate) below: u64,
    /// Index one past this node's last descendant.
    pub(crate) subtree_end: u32,
    /// This node's own tokens are `token_ids[tokens_start..tokens_end]`; its whole subtree's are
    /// `token_ids[tokens_start..subtree_tokens_end]`.
    pub(crate) tokens_start: u32,
    pub(crate) tokens_end: u32,
    pub(crate) subtree_tokens_end: u32,
    pub(crate) depth: u16,
    /// Length of the longest path below this node.
    pub(crate) height: u16,
    pub(crate) byte: u8,
}

/// Coarse byte groups for subtree signatures: each ASCII punctuation character, space, tab, LF and
/// CR on its own (they are what regexes single out), then digits, lower case, upper case, other
/// control bytes, and four UTF-8 ranges: 44 groups, so a set of them fits a `u64`.
pub(crate) const BYTE_GROUP: [u8; 256] = {
    const PUNCT: &[u8] = b" !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~\t\n\r";
    let mut t = [0u8; 256];
    let mut b = 0usize;
    while b < 256 {
        t[b] = match b as u8 {
            b'0'..=b'9' => 0,
            b'a'..=b'z' => 1,
            b'A'..=b'Z' => 2,
            0x80..=0xBF => 3,
            0xC0..=0xDF => 4,
            0xE0..=0xEF => 5,
            0xF0..=0xFF => 6,
            _ => 7 + PUNCT.len() as u8, // other control bytes and DEL, unless listed below
        };
        b += 1;
    }
    let mut i = 0;
    while i < PUNCT.len() {
        t[PUNCT[i] as usize] = 7 + i as u8;
        i += 1;
    }
    t
};

impl TokenTrie {
    /// The trie of the non-special, non-empty tokens `keep` accepts.
    pub(crate) fn new(vocab: &Vocabulary, keep: impl Fn(u32) -> bool) -> Self {
        let mut ids: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&i| {
                !vocab.is_special(i) && !vocab.token_bytes(i).unwrap().is_empty() && keep(i)
            })
            .collect();
        ids.sort_by(|&a, &b| vocab.token_bytes(a).cmp(&vocab.token_bytes(b)));
        let node = |byte: u8, depth: usize, first_token: usize| Node {
            below: 0,
            subtree_end: 0,
            tokens_start: first_token as u32,
            tokens_end: first_token as u32,
            subtree_tokens_end: 0,
            depth: depth as u16,
            height: 0,
            byte,
        };
        let mut nodes = vec![node(0, 0, 0)];
        let mut token_ids = Vec::with_capacity(ids.len());
        // `path[d]` is the node index at depth d on the current path.
        let mut path: Vec<usize> = vec![0];
        let mut prev: &[u8] = &[];
        let mut max_depth = 0;
        let close = |nodes: &mut Vec<Node>, n: usize, tokens: usize| {
            let end = nodes.len() as u32;
            nodes[n].subtree_end = end;
            nodes[n].subtree_tokens_end = tokens as u32;
        };
        for &id in &ids {
            let bytes = vocab.token_bytes(id).unwrap();
            // Tokens longer than u16::MAX bytes do not occur in real vocabularies; cap the depth
            // rather than overflow (such a token is then simply never allowed).
            if bytes.len() >= u16::MAX as usize {
                continue;
            }
            max_depth = max_depth.max(bytes.len());
            let common = bytes.iter().zip(prev).take_while(|(a, b)| a == b).count();
            // Close the nodes of the previous path below the common prefix.
            while path.len() > common + 1 {
                let n = path.pop().unwrap();
                close(&mut nodes, n, token_ids.len());
            }
            for (d, &b) in bytes.iter().enumerate().skip(common) {
                nodes.push(node(b, d + 1, token_ids.len()));
                path.push(nodes.len() - 1);
            }
            // Sorted order puts a token right after the node its bytes end at was created (or after
            // an identical token), so its ids are contiguous there.
            let leaf = *path.last().unwrap();
            token_ids.push(id);
            nodes[leaf].tokens_end = token_ids.len() as u32;
            prev = bytes;
        }
        while let Some(n) = path.pop() {
            close(&mut nodes, n, token_ids.len());
        }
        // Signatures bottom-up: a node's parent is the nearest earlier node one level up.
        let mut parent = vec![0u32; nodes.len()];
        let mut stack: Vec<usize> = vec![0];
        for i in 1..nodes.len() {
            while nodes[*stack.last().unwrap()].depth >= nodes[i].depth {
                stack.pop();
            }
            parent[i] = *stack.last().unwrap() as u32;
            stack.push(i);
        }
        for i in (1..nodes.len()).rev() {
            let up = nodes[i].below | 1 << BYTE_GROUP[nodes[i].byte as usize];
            let h = nodes[i].height + 1;
            let p = &mut nodes[parent[i] as usize];
            p.below |= up;
            p.height = p.height.max(h);
        }
        TokenTrie {
            nodes,
            token_ids,
            max_depth,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slice's masks by length in characters count a character begun at a token's end
    /// (byte-level BPE splits characters) as one, and a multi-byte character as one.
    #[test]
    fn the_text_slice_by_characters_counts_a_character_begun_at_the_end() {
        let tokens: [&[u8]; 6] = [
            b"ab",
            "h\u{e9}llo".as_bytes(),
            b"h\xC3",
            b"\xE2\x80",
            b"a\"",
            b"</s>",
        ];
        let v = Vocabulary::new(tokens.iter().enumerate().map(|(i, t)| (*t, i == 5)), &[5]);
        let text = v.text();
        let ids = |chars: usize| -> Vec<u32> {
            (0..tokens.len() as u32)
                .filter(|&t| text.within(chars)[t as usize / 32] >> (t % 32) & 1 == 1)
                .collect()
        };
        assert_eq!(text.longest_chars(), 5);
        assert!(ids(0).is_empty());
        assert_eq!(ids(1), [3]);
        assert_eq!(ids(2), [0, 2, 3]);
        assert_eq!(ids(4), [0, 2, 3]);
        assert_eq!(ids(5), [0, 1, 2, 3]);
        assert_eq!(ids(usize::MAX), [0, 1, 2, 3]);
        assert_eq!(text.longer_than(2), [1]);
        assert!(text.longer_than(5).is_empty());
        let mut all = text.longer_than(0).to_vec();
        all.sort_unstable();
        assert_eq!(all, [0, 1, 2, 3]);
    }
}
