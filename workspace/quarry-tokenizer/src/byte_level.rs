//! GPT-2 byte-level BPE's reversible byte ↔ character mapping.
//!
//! Byte-level vocabularies spell every byte as a printable character: the printable Latin-1 bytes map
//! to themselves and the remaining 68 bytes (controls, space, 0x7F–0xA0, 0xAD) to U+0100 onwards, in
//! byte order. Decoding a token is mapping each character back to its byte.

/// `BYTE_TO_CHAR[b]` is the character that spells byte `b`.
pub(crate) fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(next).expect("U+0100..U+0143 are valid scalars");
            next += 1;
            c
        };
    }
    table
}

/// Inverse of [`byte_to_char`]: indexed by `char as usize` below 0x144.
pub(crate) struct CharToByte([Option<u8>; 0x144]);

impl CharToByte {
    pub(crate) fn new() -> Self {
        let mut inv = [None; 0x144];
        for (b, c) in byte_to_char().iter().enumerate() {
            inv[*c as usize] = Some(b as u8);
        }
        Self(inv)
    }

    /// Decodes a byte-level token string; `None` if it holds a character outside the mapping.
    pub(crate) fn decode(&self, token: &str, out: &mut Vec<u8>) -> bool {
        for c in token.chars() {
            match self.0.get(c as usize).copied().flatten() {
                Some(b) => out.push(b),
                None => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_is_a_bijection_onto_printable_chars() {
        let t = byte_to_char();
        let mut seen = std::collections::HashSet::new();
        for c in t {
            assert!(
                !c.is_control() && !c.is_whitespace(),
                "{c:?} is not printable"
            );
            assert!(seen.insert(c));
        }
        let inv = CharToByte::new();
        for b in 0..=255u8 {
            let mut out = Vec::new();
            assert!(inv.decode(&t[b as usize].to_string(), &mut out));
            assert_eq!(out, [b]);
        }
        // Space is the 33rd non-printable byte in order, hence "Ġ" (U+0120).
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
    }
}
