//! The vocabulary as plain data, and the byte trie that token masks are computed over.

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
        v.trie = TokenTrie::new(&v);
        v
    }

    pub(crate) fn trie(&self) -> &TokenTrie {
        &self.trie
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

/// A byte trie of the non-special tokens, stored in preorder so a walk can skip a dead subtree in
/// one step.
#[derive(Debug, Clone, Default)]
pub(crate) struct TokenTrie {
    pub(crate) nodes: Vec<Node>,
    /// Token ids ending at a node: `node.tokens_start..node.tokens_end` indexes this.
    pub(crate) token_ids: Vec<u32>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Node {
    pub(crate) byte: u8,
    pub(crate) depth: u32,
    /// Index one past this node's last descendant.
    pub(crate) subtree_end: u32,
    pub(crate) tokens_start: u32,
    pub(crate) tokens_end: u32,
}

impl TokenTrie {
    pub(crate) fn new(vocab: &Vocabulary) -> Self {
        let mut ids: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&i| !vocab.is_special(i) && !vocab.token_bytes(i).unwrap().is_empty())
            .collect();
        ids.sort_by(|&a, &b| vocab.token_bytes(a).cmp(&vocab.token_bytes(b)));
        let root = Node {
            byte: 0,
            depth: 0,
            subtree_end: 0,
            tokens_start: 0,
            tokens_end: 0,
        };
        let mut nodes = vec![root];
        let mut token_ids = Vec::with_capacity(ids.len());
        // `path[d]` is the node index at depth d on the current path.
        let mut path: Vec<usize> = vec![0];
        let mut prev: &[u8] = &[];
        for &id in &ids {
            let bytes = vocab.token_bytes(id).unwrap();
            let common = bytes.iter().zip(prev).take_while(|(a, b)| a == b).count();
            // Close the nodes of the previous path below the common prefix.
            while path.len() > common + 1 {
                let n = path.pop().unwrap();
                nodes[n].subtree_end = nodes.len() as u32;
            }
            for (d, &b) in bytes.iter().enumerate().skip(common) {
                nodes.push(Node {
                    byte: b,
                    depth: d as u32 + 1,
                    subtree_end: 0,
                    tokens_start: 0,
                    tokens_end: 0,
                });
                path.push(nodes.len() - 1);
            }
            let leaf = *path.last().unwrap();
            if nodes[leaf].tokens_end == 0 {
                nodes[leaf].tokens_start = token_ids.len() as u32;
            }
            token_ids.push(id);
            nodes[leaf].tokens_end = token_ids.len() as u32;
            prev = bytes;
        }
        while let Some(n) = path.pop() {
            nodes[n].subtree_end = nodes.len() as u32;
        }
        TokenTrie { nodes, token_ids }
    }
}
