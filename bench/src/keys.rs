//! Which key each acquisition takes: the one contended key of S3 and S8, or
//! a Zipf-distributed choice among many (S9: a service with hot keys).
//!
//! The choice is pseudo-random but repeatable: each task draws from its own
//! xorshift generator seeded from its number, so a run's key sequence does
//! not depend on scheduling. No crate in the workspace's lock file provides
//! a Zipf distribution (`rand_distr` is absent), so [`Zipf`] is an
//! inverse-CDF table: a binary search over the cumulative probabilities of
//! the ranks, exact for a finite key space.

use anyhow::{bail, Context, Result};

/// A small xorshift64 generator: repeatable, no dependency.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for stream `seed` (any value; mixed so that it is never
    /// the all-zero state, from which xorshift does not move).
    pub fn new(seed: u64) -> Self {
        Rng((seed ^ 0x9E37_79B9_7F4A_7C15).max(1))
    }

    /// The next 64 pseudo-random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `[0, 1)`, from the top 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Zipf's law over ranks `0..n`: rank `k` has probability proportional to
/// `1 / (k + 1)^s`.
#[derive(Clone, Debug)]
pub struct Zipf {
    /// Cumulative probability up to and including each rank; the last is 1.
    cdf: Vec<f64>,
}

impl Zipf {
    /// The table for `n` ranks (at least 1) and exponent `s` (positive).
    pub fn new(n: u32, s: f64) -> Self {
        let weights: Vec<f64> = (1..=n.max(1)).map(|k| f64::from(k).powf(-s)).collect();
        let total: f64 = weights.iter().sum();
        let mut sum = 0.0;
        let mut cdf: Vec<f64> = weights
            .iter()
            .map(|w| {
                sum += w;
                sum / total
            })
            .collect();
        if let Some(last) = cdf.last_mut() {
            *last = 1.0; // no rounding gap above the last rank
        }
        Zipf { cdf }
    }

    /// The rank for a uniform draw `u` in `[0, 1)`.
    pub fn rank(&self, u: f64) -> u32 {
        let i = self.cdf.partition_point(|&c| c <= u);
        u32::try_from(i.min(self.cdf.len() - 1)).unwrap_or(u32::MAX)
    }

    /// Probability of rank `k`.
    pub fn probability(&self, k: u32) -> f64 {
        let k = k as usize;
        let below = if k == 0 { 0.0 } else { self.cdf[k - 1] };
        self.cdf.get(k).map_or(0.0, |c| c - below)
    }
}

/// How a contention run's workers choose the key of each acquisition.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KeyChoice {
    /// Always the same key (S3, S8).
    One,
    /// One of `keys` keys, Zipf-distributed with exponent `s` (S9).
    Zipf {
        /// Distinct keys.
        keys: u32,
        /// The exponent.
        s: f64,
    },
}

impl KeyChoice {
    /// How many distinct keys there are.
    pub fn keys(self) -> u32 {
        match self {
            KeyChoice::One => 1,
            KeyChoice::Zipf { keys, .. } => keys,
        }
    }

    /// The lock key of key number `k`.
    pub fn key(self, k: u32) -> String {
        match self {
            KeyChoice::One => "contended".to_owned(),
            KeyChoice::Zipf { .. } => format!("hot:{k}"),
        }
    }

    /// The data server's counter of key number `k`, under `prefix`.
    pub fn counter(self, prefix: &str, k: u32) -> String {
        match self {
            KeyChoice::One => format!("{prefix}counter"),
            KeyChoice::Zipf { .. } => format!("{prefix}counter:{k}"),
        }
    }

    /// A picker of key numbers for task `task`.
    pub fn picker(self, task: u32) -> Picker {
        match self {
            KeyChoice::One => Picker::One,
            KeyChoice::Zipf { keys, s } => {
                Picker::Zipf(Zipf::new(keys, s), Rng::new(u64::from(task) + 1))
            }
        }
    }

    /// On the worker's command line: `one`, or `zipf:<keys>:<s>`.
    pub fn to_arg(self) -> String {
        match self {
            KeyChoice::One => "one".to_owned(),
            KeyChoice::Zipf { keys, s } => format!("zipf:{keys}:{s}"),
        }
    }

    /// Parses [`to_arg`](Self::to_arg)'s format.
    pub fn parse(arg: &str) -> Result<Self> {
        if arg == "one" {
            return Ok(KeyChoice::One);
        }
        let parts: Vec<&str> = arg.split(':').collect();
        let ["zipf", keys, s] = parts[..] else {
            bail!("bad key choice {arg:?}: `one` or `zipf:<keys>:<s>`");
        };
        let keys: u32 = keys.parse().with_context(|| format!("keys in {arg:?}"))?;
        let s: f64 = s.parse().with_context(|| format!("exponent in {arg:?}"))?;
        if keys == 0 || !(s > 0.0 && s.is_finite()) {
            bail!("bad key choice {arg:?}: keys >= 1 and a positive exponent");
        }
        Ok(KeyChoice::Zipf { keys, s })
    }
}

/// One task's source of key numbers.
#[derive(Clone, Debug)]
pub enum Picker {
    /// Always key 0.
    One,
    /// Zipf-distributed ranks from a seeded generator.
    Zipf(Zipf, Rng),
}

impl Picker {
    /// The key number of the next acquisition.
    pub fn next_key(&mut self) -> u32 {
        match self {
            Picker::One => 0,
            Picker::Zipf(zipf, rng) => zipf.rank(rng.next_f64()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn zipf_table_matches_the_law() {
        let z = Zipf::new(1000, 1.1);
        // p(0) / p(1) = 2^1.1.
        let ratio = z.probability(0) / z.probability(1);
        assert!((ratio - 2f64.powf(1.1)).abs() < 1e-9, "{ratio}");
        assert_eq!(z.rank(0.0), 0);
        assert_eq!(z.rank(0.999_999_999), 999);
        let mut picker = KeyChoice::Zipf { keys: 1000, s: 1.1 }.picker(3);
        let draws = 100_000;
        let hottest = (0..draws).filter(|_| picker.next_key() == 0).count();
        let share = hottest as f64 / f64::from(draws);
        assert!((share - z.probability(0)).abs() < 0.01, "{share}");
    }

    #[test]
    fn choices_round_trip_and_pickers_repeat() {
        for c in [KeyChoice::One, KeyChoice::Zipf { keys: 1000, s: 1.1 }] {
            assert_eq!(KeyChoice::parse(&c.to_arg()).unwrap(), c);
        }
        assert!(KeyChoice::parse("zipf:0:1").is_err());
        assert!(KeyChoice::parse("zipf:10").is_err());
        let c = KeyChoice::Zipf { keys: 50, s: 1.1 };
        let (mut a, mut b) = (c.picker(7), c.picker(7));
        assert!((0..100).all(|_| a.next_key() == b.next_key()));
        assert_eq!(KeyChoice::One.picker(1).next_key(), 0);
    }
}
