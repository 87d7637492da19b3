//! A small stable hash for cache keys (std's `DefaultHasher` may change between releases).

/// 64-bit FNV-1a.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod source_hash_tests {
    #[test]
    fn the_source_digest_is_made_at_build_time() {
        let h = crate::SOURCE_HASH;
        assert_eq!(h.len(), 16, "{h}");
        assert!(h.chars().all(|c| c.is_ascii_hexdigit()), "{h}");
        assert_ne!(h, "cbf29ce484222325", "the digest of no sources");
    }
}
