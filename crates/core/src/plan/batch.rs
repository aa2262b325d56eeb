//! Batch arithmetic of a batched Deployment rollout, as in the seed's Canary operator:
//! `step = round(total / batches)`; batch N targets `1 + (N-1) * step` new replicas, capped
//! at `total`; the last batch targets `total`; old replicas are `total - new.available`.
//!
//! Edge cases:
//! - `batches > total`: the step rounds to 0 or 1, so early batches target 1 and the last
//!   `total` (targets never decrease).
//! - `batches = 1`: the only batch is the last and targets `total`.
//! - `total = 0`: every batch targets 0.
//! - rounding at .5 goes away from zero, like Go's `math.Round` (5 / 2 → 3).

/// The step between batches: `total / batches`, rounded half away from zero.
pub fn step(total: i32, batches: i32) -> i32 {
    if batches <= 0 || total <= 0 {
        return 0;
    }
    (2 * total + batches) / (2 * batches)
}

/// New-version replicas batch `n` (1-based) brings the rollout to.
pub fn target(total: i32, batches: i32, n: i32) -> i32 {
    let total = total.max(0);
    let batches = batches.max(1);
    if n >= batches {
        return total;
    }
    (1 + (n.max(1) - 1) * step(total, batches)).min(total)
}

/// Old-version replicas while the new version has `new_available` available pods.
pub fn old_replicas(total: i32, new_available: i32) -> i32 {
    (total - new_available.max(0)).max(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_seeds_example_four_replicas_two_batches() {
        assert_eq!(step(4, 2), 2);
        assert_eq!(target(4, 2, 1), 1);
        assert_eq!(target(4, 2, 2), 4);
        assert_eq!(old_replicas(4, 1), 3);
        assert_eq!(old_replicas(4, 4), 0);
    }

    #[test]
    fn more_batches_than_replicas() {
        // step = round(2 / 5) = 0: every batch but the last targets 1.
        assert_eq!(step(2, 5), 0);
        assert_eq!(
            (1..=5).map(|n| target(2, 5, n)).collect::<Vec<_>>(),
            [1, 1, 1, 1, 2]
        );
        // step = round(3 / 4) = 1.
        assert_eq!(
            (1..=4).map(|n| target(3, 4, n)).collect::<Vec<_>>(),
            [1, 2, 3, 3]
        );
    }

    #[test]
    fn one_batch_is_everything_at_once() {
        assert_eq!(target(7, 1, 1), 7);
    }

    #[test]
    fn no_replicas_targets_nothing() {
        assert_eq!(step(0, 3), 0);
        assert_eq!(
            (1..=3).map(|n| target(0, 3, n)).collect::<Vec<_>>(),
            [0, 0, 0]
        );
        assert_eq!(old_replicas(0, 0), 0);
    }

    #[test]
    fn rounding_at_one_half_goes_up() {
        assert_eq!(step(5, 2), 3); // 2.5
        assert_eq!(step(3, 2), 2); // 1.5
        assert_eq!(step(7, 2), 4); // 3.5
        assert_eq!(step(10, 4), 3); // 2.5
        assert_eq!(step(9, 4), 2); // 2.25
        assert_eq!((1..=2).map(|n| target(5, 2, n)).collect::<Vec<_>>(), [1, 5]);
    }

    #[test]
    fn three_batches_of_six() {
        assert_eq!(
            (1..=3).map(|n| target(6, 3, n)).collect::<Vec<_>>(),
            [1, 3, 6]
        );
    }

    proptest! {
        #[test]
        fn targets_never_decrease_and_the_last_is_total(total in 0i32..200, batches in 1i32..50) {
            let targets: Vec<i32> = (1..=batches).map(|n| target(total, batches, n)).collect();
            prop_assert!(targets.windows(2).all(|w| w[0] <= w[1]), "{:?}", targets);
            prop_assert_eq!(*targets.last().unwrap_or(&0), total);
            prop_assert!(targets.iter().all(|t| (0..=total).contains(t)));
        }

        /// While batch n moves, old replicas follow the new version's available pods, so
        /// new available plus old never falls below `total - 1`.
        #[test]
        fn serving_replicas_never_fall_below_total_minus_one(
            total in 0i32..200,
            batches in 1i32..50,
            n in 1i32..50,
            available_fraction in 0.0f64..=1.0,
        ) {
            let t = target(total, batches, n.min(batches));
            let available = (f64::from(t) * available_fraction).floor() as i32;
            prop_assert!(available + old_replicas(total, available) >= total - 1);
        }
    }
}
