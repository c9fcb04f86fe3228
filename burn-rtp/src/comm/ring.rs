//! The ring's index arithmetic: who a rank talks to and which shard it holds at each step.
//!
//! Ranks form a ring; every message goes to rank `r + 1` and comes from rank `r - 1`. At step
//! `t` of a rotation rank `r` holds shard `r - t`; a travelling gradient buffer it adds to at
//! step `t` belongs to shard `r - 1 - t`, so after `N` steps each buffer is back home.

/// The ring's index arithmetic, in one place: who this rank talks to and which shard it holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ring {
    /// This rank.
    pub rank: usize,
    /// Ranks in the ring.
    pub n: usize,
}

impl Ring {
    /// The ring of a world of `n` ranks, seen from `rank`.
    pub(crate) fn new(rank: usize, n: usize) -> Self {
        debug_assert!(rank < n, "rank {rank} is outside a ring of {n}");
        Self { rank, n }
    }

    /// Where every message goes.
    pub(crate) fn next(self) -> usize {
        (self.rank + 1) % self.n
    }

    /// Where every message comes from.
    pub(crate) fn prev(self) -> usize {
        (self.rank + self.n - 1) % self.n
    }

    /// The shard a rotation holds at step `t`: `r - t`.
    pub(crate) fn held(self, t: usize) -> usize {
        (self.rank + self.n - t % self.n) % self.n
    }

    /// The travelling gradient buffer a reduce-scatter adds to at step `t`: `r - 1 - t`.
    pub(crate) fn travelling(self, t: usize) -> usize {
        (self.rank + 2 * self.n - 1 - t % self.n) % self.n
    }
}

#[cfg(test)]
mod tests {
    use super::Ring;

    #[test]
    fn every_rank_sees_every_shard_once_and_buffers_end_at_home() {
        for n in 1..=8 {
            for t in 0..n {
                let held: Vec<usize> = (0..n).map(|r| Ring::new(r, n).held(t)).collect();
                let mut sorted = held.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "n={n} t={t}: {held:?}");
            }
            for r in 0..n {
                let ring = Ring::new(r, n);
                assert_eq!(Ring::new(ring.next(), n).prev(), r);
                // The last addition is to the rank's own buffer, which is then complete.
                assert_eq!(ring.travelling(n - 1), r);
                // What a rank passes on at step t is what its neighbour adds to at step t + 1.
                for t in 0..n - 1 {
                    assert_eq!(
                        ring.travelling(t),
                        Ring::new(ring.next(), n).travelling(t + 1)
                    );
                }
            }
        }
    }
}
