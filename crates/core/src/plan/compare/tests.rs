use proptest::prelude::*;

use super::*;

/// `n` samples around `center`, spread ±`spread` (relative) by a fixed pattern.
fn around(center: f64, spread: f64, n: usize, phase: usize) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let wobble = (((i + phase) * 7919) % 101) as f64 / 100.0 - 0.5;
            center * (1.0 + 2.0 * spread * wobble)
        })
        .collect()
}

#[test]
fn the_p_value_is_scipys_for_its_documented_example() {
    // scipy.stats.mannwhitneyu(males, females, method="asymptotic"): U=17, p=0.11134688653314041
    // (two-sided, continuity-corrected); one-sided it is half.
    let males = [19.0, 22.0, 16.0, 29.0, 24.0];
    let females = [20.0, 11.0, 17.0, 12.0];
    let p = worse_p_value(&males, &females, Worse::Higher);
    assert!((p - 0.111_346_886_533_140_41 / 2.0).abs() < 1e-6, "{p}");
    let other_way = worse_p_value(&males, &females, Worse::Lower);
    assert!(other_way > 0.9, "{other_way}");
}

#[test]
fn ties_are_averaged_and_corrected_for() {
    let p = worse_p_value(
        &[1.0, 2.0, 2.0, 3.0, 4.0, 5.0, 5.0, 6.0],
        &[2.0, 2.0, 3.0, 3.0, 1.0, 1.0, 0.0, 2.0],
        Worse::Higher,
    );
    // The same normal approximation computed in Python with math.erfc.
    assert!((p - 0.030_166_157_561_371_258).abs() < 1e-6, "{p}");
    assert_eq!(worse_p_value(&[1.0; 5], &[1.0; 5], Worse::Higher), 1.0);
}

#[test]
fn an_error_rate_four_times_the_baselines_fails_and_a_fifth_more_passes() {
    let rule = Comparison::default();
    let baseline = around(0.005, 0.2, 12, 0);
    let bad = compare(&around(0.02, 0.2, 12, 3), &baseline, &rule);
    assert_eq!(bad.classification, Classification::Fail, "{bad:?}");
    assert!(bad.relative_change.unwrap() > 2.5, "{bad:?}");
    assert!(bad.p_value.unwrap() < 0.001, "{bad:?}");
    let fine = compare(&around(0.006, 0.2, 12, 3), &baseline, &rule);
    assert_eq!(fine.classification, Classification::Pass, "{fine:?}");
    assert_eq!((fine.canary_samples, fine.baseline_samples), (12, 12));
}

#[test]
fn three_samples_are_not_enough_data_and_score_nothing() {
    let v = compare(&[0.02; 3], &[0.005; 3], &Comparison::default());
    assert_eq!(v.classification, Classification::NotEnoughData);
    assert_eq!(v.p_value, None);
    let s = score(
        &[
            Judged {
                classification: v.classification,
                weight: 1.0,
                critical: false,
            },
            Judged {
                classification: Classification::Pass,
                weight: 1.0,
                critical: false,
            },
        ],
        90,
        60,
    );
    assert_eq!(s.overall, Overall::NotEnoughData);
}

#[test]
fn a_value_that_is_not_a_number_is_not_data() {
    let mut canary = around(1.0, 0.1, 10, 0);
    canary[4] = f64::NAN;
    let v = compare(&canary, &around(1.0, 0.1, 10, 1), &Comparison::default());
    assert_eq!(v.classification, Classification::NotEnoughData);
}

#[test]
fn lower_is_worse_fails_a_throughput_that_drops() {
    let rule = Comparison {
        worse: Worse::Lower,
        ..Comparison::default()
    };
    let baseline = around(100.0, 0.05, 10, 0);
    let v = compare(&around(50.0, 0.05, 10, 2), &baseline, &rule);
    assert_eq!(v.classification, Classification::Fail, "{v:?}");
    // Higher throughput is better, however much higher.
    let v = compare(&around(300.0, 0.05, 10, 2), &baseline, &rule);
    assert_eq!(v.classification, Classification::Pass, "{v:?}");
}

#[test]
fn a_zero_baseline_makes_any_worse_median_infinitely_worse() {
    let v = compare(&[0.01; 10], &[0.0; 10], &Comparison::default());
    assert_eq!(v.relative_change, Some(f64::INFINITY));
    assert_eq!(v.classification, Classification::Fail);
    let v = compare(&[0.0; 10], &[0.0; 10], &Comparison::default());
    assert_eq!(v.classification, Classification::Pass);
}

fn judged(c: Classification, weight: f64, critical: bool) -> Judged {
    Judged {
        classification: c,
        weight,
        critical,
    }
}

#[test]
fn the_score_is_the_weighted_share_that_passed_within_its_bounds() {
    use Classification::{Fail, Pass};
    let s = score(
        &[judged(Pass, 3.0, false), judged(Fail, 1.0, false)],
        90,
        60,
    );
    assert_eq!(
        s,
        Score {
            score: 75,
            overall: Overall::Marginal
        }
    );
    let s = score(&[judged(Pass, 1.0, false); 4], 90, 60);
    assert_eq!(s.overall, Overall::Pass);
    let s = score(
        &[judged(Pass, 1.0, false), judged(Fail, 3.0, false)],
        90,
        60,
    );
    assert_eq!((s.score, s.overall), (25, Overall::Fail));
    // A critical failure fails the whole, whatever the score.
    let s = score(&[judged(Pass, 9.0, false), judged(Fail, 1.0, true)], 90, 60);
    assert_eq!((s.score, s.overall), (90, Overall::Fail));
    assert_eq!(score(&[], 90, 60).overall, Overall::NotEnoughData);
}

fn samples(min: usize) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(1.0f64..1.2, min..30)
}

proptest! {
    /// Canary and baseline from the same narrow range never fail: the medians cannot differ
    /// by more than the tolerance, whatever the test says.
    #[test]
    fn samples_of_one_range_never_fail(canary in samples(10), baseline in samples(10)) {
        let v = compare(&canary, &baseline, &Comparison::default());
        prop_assert_eq!(v.classification, Classification::Pass);
    }

    /// A canary whose every sample is past the baseline's worst by more than the tolerance
    /// fails once each side has 8 samples (complete separation: p < 0.001).
    #[test]
    fn a_canary_clearly_worse_always_fails(
        canary in prop::collection::vec(2.0f64..3.0, 8..30),
        baseline in prop::collection::vec(1.0f64..1.5, 8..30),
    ) {
        let rule = Comparison { min_samples: 8, ..Comparison::default() };
        let v = compare(&canary, &baseline, &rule);
        prop_assert_eq!(v.classification, Classification::Fail);
        prop_assert!(v.p_value.unwrap() < 0.001);
    }

    /// The order of the samples and the unit of the metric change nothing.
    #[test]
    fn order_and_scale_change_nothing(
        canary in samples(10),
        baseline in prop::collection::vec(0.5f64..2.0, 10..30),
        rotate in 0usize..30,
        scale in 0.001f64..1000.0,
    ) {
        let rule = Comparison::default();
        let v = compare(&canary, &baseline, &rule);
        let mut rotated = canary.clone();
        let n = rotate % rotated.len();
        rotated.rotate_left(n);
        let mut reversed = baseline.clone();
        reversed.reverse();
        let w = compare(&rotated, &reversed, &rule);
        prop_assert_eq!(v.classification, w.classification);
        prop_assert!((v.p_value.unwrap() - w.p_value.unwrap()).abs() < 1e-12);
        let scaled = |s: &[f64]| s.iter().map(|x| x * scale).collect::<Vec<_>>();
        let s = compare(&scaled(&canary), &scaled(&baseline), &rule);
        prop_assert_eq!(v.classification, s.classification);
    }

    /// Too few samples on either side is never a verdict.
    #[test]
    fn too_few_samples_is_not_enough_data(
        canary in prop::collection::vec(0.0f64..10.0, 0..10),
        baseline in prop::collection::vec(0.0f64..10.0, 10..20),
        swap in any::<bool>(),
    ) {
        let (c, b) = if swap { (&baseline, &canary) } else { (&canary, &baseline) };
        let v = compare(c, b, &Comparison::default());
        prop_assert_eq!(v.classification, Classification::NotEnoughData);
    }

    /// The p-values of the two directions are complements, up to the continuity correction.
    #[test]
    fn a_p_value_is_a_probability(
        canary in prop::collection::vec(0.0f64..10.0, 1..30),
        baseline in prop::collection::vec(0.0f64..10.0, 1..30),
    ) {
        for worse in [Worse::Higher, Worse::Lower] {
            let p = worse_p_value(&canary, &baseline, worse);
            prop_assert!((0.0..=1.0).contains(&p), "{}", p);
        }
    }
}
