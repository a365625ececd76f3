//! The deterministic, position-dependent byte stream every tunnel's data is checked against.

pub const UP_SEED_XOR: u64 = 0x5a5a_c3c3_0ff0_a55a;

#[inline]
pub fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The deterministic byte stream for one seed; `pos` is the next byte's offset.
pub struct Pattern {
    pub seed: u64,
    pub pos: u64,
}

impl Pattern {
    pub fn new(seed: u64) -> Self {
        Pattern { seed, pos: 0 }
    }
    #[inline]
    pub fn word(&self, idx: u64) -> u64 {
        splitmix(self.seed ^ idx.wrapping_mul(0xD6E8_FEB8_6659_FD93))
    }
    #[inline]
    pub fn byte(&self, pos: u64) -> u8 {
        self.word(pos / 8).to_le_bytes()[(pos % 8) as usize]
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut i = 0;
        while i < buf.len() && !self.pos.is_multiple_of(8) {
            buf[i] = self.byte(self.pos);
            i += 1;
            self.pos += 1;
        }
        let n8 = (buf.len() - i) / 8 * 8;
        let base = self.pos / 8;
        for (k, c) in buf[i..i + n8].chunks_exact_mut(8).enumerate() {
            c.copy_from_slice(&self.word(base + k as u64).to_le_bytes());
        }
        self.pos += n8 as u64;
        i += n8;
        while i < buf.len() {
            buf[i] = self.byte(self.pos);
            i += 1;
            self.pos += 1;
        }
    }
    /// Compares `data` with the stream at `pos`; Err(offset) of the first mismatch.
    pub fn check(&mut self, data: &[u8]) -> Result<(), u64> {
        let mut i = 0;
        while i < data.len() && !self.pos.is_multiple_of(8) {
            if data[i] != self.byte(self.pos) {
                return Err(self.pos);
            }
            i += 1;
            self.pos += 1;
        }
        let n8 = (data.len() - i) / 8 * 8;
        let base = self.pos / 8;
        for (k, c) in data[i..i + n8].chunks_exact(8).enumerate() {
            if u64::from_le_bytes(c.try_into().unwrap()) != self.word(base + k as u64) {
                let at = self.pos + (k as u64) * 8;
                for j in 0..8u64 {
                    if c[j as usize] != self.byte(at + j) {
                        return Err(at + j);
                    }
                }
            }
        }
        self.pos += n8 as u64;
        i += n8;
        while i < data.len() {
            if data[i] != self.byte(self.pos) {
                return Err(self.pos);
            }
            i += 1;
            self.pos += 1;
        }
        Ok(())
    }
}
