//! The statistical judge (issue 75): a canary's samples of one metric against a baseline's,
//! as Kayenta's Mann-Whitney classifier judges them, and the score of several metrics. Pure:
//! samples in, verdict out; the controller gathers the samples.
//!
//! A metric fails only when both hold: the canary is worse with significance (a one-sided
//! Mann-Whitney U test, normal approximation with tie and continuity corrections, below
//! `1 - confidence`), and its median is worse than the baseline's by more than `tolerance`
//! (relative). Either alone is not enough: a tiny but consistent difference is tolerated, and
//! a large one in noisy data is not yet evidence. Fewer samples than `min_samples` on either
//! side is "not enough data", never a pass.

/// Which way a metric gets worse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Worse {
    /// Error rates, latencies.
    Higher,
    /// Throughput, success rates.
    Lower,
}

/// How one metric is compared.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    pub worse: Worse,
    /// The relative change of the canary's median, in the worse direction, that is tolerated
    /// (`0.25`: up to 25 % worse than the baseline).
    pub tolerance: f64,
    /// Samples needed on each side before anything is judged.
    pub min_samples: usize,
    /// How sure the test must be that the canary is worse (`0.95`).
    pub confidence: f64,
}

impl Default for Comparison {
    fn default() -> Self {
        Comparison {
            worse: Worse::Higher,
            tolerance: 0.25,
            min_samples: 10,
            confidence: 0.95,
        }
    }
}

/// One metric's classification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Classification {
    Pass,
    /// Worse, beyond the tolerance, with significance.
    Fail,
    /// Fewer samples than asked for on a side (or a sample that is not a number).
    NotEnoughData,
}

/// One metric's comparison, with the evidence for it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MetricVerdict {
    pub classification: Classification,
    pub canary_samples: usize,
    pub baseline_samples: usize,
    pub canary_median: Option<f64>,
    pub baseline_median: Option<f64>,
    /// The canary's median against the baseline's, signed so that positive is worse
    /// (`0.3`: 30 % worse); infinite when the baseline's median is 0 and the canary's worse.
    pub relative_change: Option<f64>,
    /// The one-sided p-value of "the canary is worse".
    pub p_value: Option<f64>,
}

/// Compares `canary` with `baseline` (one sample per measurement interval of each).
pub fn compare(canary: &[f64], baseline: &[f64], c: &Comparison) -> MetricVerdict {
    let mut verdict = MetricVerdict {
        classification: Classification::NotEnoughData,
        canary_samples: canary.len(),
        baseline_samples: baseline.len(),
        canary_median: None,
        baseline_median: None,
        relative_change: None,
        p_value: None,
    };
    let finite = |s: &[f64]| s.iter().all(|v| v.is_finite());
    let enough = c.min_samples.max(1);
    if canary.len() < enough || baseline.len() < enough || !finite(canary) || !finite(baseline) {
        return verdict;
    }
    let (med_c, med_b) = (median(canary), median(baseline));
    let sign = match c.worse {
        Worse::Higher => 1.0,
        Worse::Lower => -1.0,
    };
    let worse_by = sign * (med_c - med_b);
    let relative = if med_b != 0.0 {
        worse_by / med_b.abs()
    } else if worse_by > 0.0 {
        f64::INFINITY
    } else if worse_by < 0.0 {
        f64::NEG_INFINITY
    } else {
        0.0
    };
    let p = worse_p_value(canary, baseline, c.worse);
    let significant = p < 1.0 - c.confidence;
    verdict.classification = if significant && relative > c.tolerance {
        Classification::Fail
    } else {
        Classification::Pass
    };
    verdict.canary_median = Some(med_c);
    verdict.baseline_median = Some(med_b);
    verdict.relative_change = Some(relative);
    verdict.p_value = Some(p);
    verdict
}

/// The judged metrics' overall result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overall {
    Pass,
    /// Between the marginal and the pass bound: hold, neither promote nor roll back.
    Marginal,
    Fail,
    NotEnoughData,
}

/// A score from 0 to 100 (the weighted share of metrics that passed) and what it means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Score {
    pub score: u8,
    pub overall: Overall,
}

/// One metric's part in the score.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Judged {
    pub classification: Classification,
    /// Its share of the score (a weight; equal weights when all are 1).
    pub weight: f64,
    /// A critical metric that fails fails the whole, whatever the score.
    pub critical: bool,
}

/// The score of `metrics`: `pass` and `marginal` are the bounds (`pass >= marginal`). Any metric
/// without enough data makes the whole "not enough data": nothing is promoted on part of the
/// evidence.
pub fn score(metrics: &[Judged], pass: u8, marginal: u8) -> Score {
    if metrics.is_empty()
        || metrics
            .iter()
            .any(|m| m.classification == Classification::NotEnoughData)
    {
        return Score {
            score: 0,
            overall: Overall::NotEnoughData,
        };
    }
    let weight = |m: &Judged| {
        if m.weight.is_finite() {
            m.weight.max(0.0)
        } else {
            0.0
        }
    };
    let total: f64 = metrics.iter().map(weight).sum();
    let passed: f64 = metrics
        .iter()
        .filter(|m| m.classification == Classification::Pass)
        .map(weight)
        .sum();
    let score = if total > 0.0 {
        (100.0 * passed / total).round().clamp(0.0, 100.0) as u8
    } else {
        0
    };
    let critical_failed = metrics
        .iter()
        .any(|m| m.critical && m.classification == Classification::Fail);
    let overall = if critical_failed {
        Overall::Fail
    } else if score >= pass {
        Overall::Pass
    } else if score >= marginal {
        Overall::Marginal
    } else {
        Overall::Fail
    };
    Score { score, overall }
}

/// The median (the mean of the middle two of an even count). `samples` is not empty.
fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

/// The one-sided p-value that `canary` is worse than `baseline` (Mann-Whitney U, normal
/// approximation, ties averaged and corrected for, continuity-corrected). 1 when every value
/// ties.
pub fn worse_p_value(canary: &[f64], baseline: &[f64], worse: Worse) -> f64 {
    let (n1, n2) = (canary.len() as f64, baseline.len() as f64);
    let n = n1 + n2;
    let mut all: Vec<(f64, bool)> = canary
        .iter()
        .map(|v| (*v, true))
        .chain(baseline.iter().map(|v| (*v, false)))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut rank_sum, mut ties) = (0.0, 0.0);
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j + 1 < all.len() && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        // Ranks i+1 ..= j+1, each given their mean.
        let rank = (i + j + 2) as f64 / 2.0;
        let t = (j - i + 1) as f64;
        ties += t * t * t - t;
        rank_sum += rank * all[i..=j].iter().filter(|(_, c)| *c).count() as f64;
        i = j + 1;
    }
    let u = rank_sum - n1 * (n1 + 1.0) / 2.0;
    let mean = n1 * n2 / 2.0;
    let variance = n1 * n2 / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0)));
    if variance <= 0.0 {
        return 1.0;
    }
    let sd = variance.sqrt();
    // Higher is worse: large U (canary ranks high) is evidence.
    let z = match worse {
        Worse::Higher => (u - mean - 0.5) / sd,
        Worse::Lower => (mean - u - 0.5) / sd,
    };
    upper_tail(z)
}

/// P(Z > z) for a standard normal Z.
fn upper_tail(z: f64) -> f64 {
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

/// The complementary error function (Numerical Recipes' `erfcc`, fractional error below
/// 1.2e-7 everywhere).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

#[cfg(test)]
mod tests;
