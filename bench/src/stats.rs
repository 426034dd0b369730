//! Order statistics over latency samples, and medians across runs.
//!
//! Every figure in the report is a percentile of one run's samples, and the
//! reported value is the median of that figure over the repeated runs: on a
//! noisy two-core machine a median of a few runs is much steadier than any
//! mean, and ratios of medians measured side by side are steadier still.

/// Sorted samples of one measurement, in microseconds.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    sorted: Vec<f64>,
}

impl Samples {
    /// Sorts `values` (NaNs are dropped).
    pub fn new(mut values: Vec<f64>) -> Self {
        values.retain(|v| !v.is_nan());
        values.sort_by(f64::total_cmp);
        Samples { sorted: values }
    }

    /// How many samples there are.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// The `q`-quantile (`0.0..=1.0`, nearest rank); NaN when empty.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.sorted.is_empty() {
            return f64::NAN;
        }
        let last = self.sorted.len() - 1;
        // Nearest rank: a value that really occurred, never an interpolation.
        let rank = (q.clamp(0.0, 1.0) * last as f64).round() as usize;
        self.sorted[rank.min(last)]
    }

    /// The median.
    pub fn p50(&self) -> f64 {
        self.quantile(0.5)
    }

    /// The 99th percentile.
    pub fn p99(&self) -> f64 {
        self.quantile(0.99)
    }

    /// The largest sample; NaN when empty.
    pub fn max(&self) -> f64 {
        self.sorted.last().copied().unwrap_or(f64::NAN)
    }

    /// The mean; NaN when empty.
    pub fn mean(&self) -> f64 {
        if self.sorted.is_empty() {
            return f64::NAN;
        }
        self.sorted.iter().sum::<f64>() / self.sorted.len() as f64
    }

    /// The samples, ascending.
    pub fn sorted(&self) -> &[f64] {
        &self.sorted
    }
}

/// Median of per-run figures (NaN when there are none).
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    Samples::new(values.into_iter().collect()).p50()
}

/// Median of one field over the runs.
pub fn median_of<T>(runs: &[T], field: impl Fn(&T) -> f64) -> f64 {
    median(runs.iter().map(field))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_pick_real_samples() {
        let s = Samples::new(vec![5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(s.p50(), 3.0);
        assert_eq!(s.quantile(0.0), 1.0);
        assert_eq!(s.max(), 5.0);
        assert_eq!(s.mean(), 3.0);
        assert!(Samples::default().p50().is_nan());
        assert_eq!(median([3.0, 1.0, 2.0]), 2.0);
    }
}
