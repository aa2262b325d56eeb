//! The points of a rollout's charts (`status.series`): a point each time the canary's weight,
//! the baseline's or the ready pods per image changed, so the dashboard draws the traffic
//! share and the pods per version over time from the status alone (after a restart too).
//! A point is added only with a change the status makes anyway: no write of its own.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{ImageReplicas, SeriesPoint};

/// The most points kept: the first (where the chart starts) and the newest.
pub const KEPT: usize = 60;

/// What a point records, as the plan has it now.
pub struct Reading<'a> {
    pub weight: Option<i32>,
    pub baseline_weight: Option<i32>,
    pub ready: &'a [ImageReplicas],
}

/// Adds a point at `now` when `reading` differs from the newest point.
pub fn record(series: &mut Vec<SeriesPoint>, now: Timestamp, reading: Reading) {
    let mut ready: Vec<ImageReplicas> = reading
        .ready
        .iter()
        .filter(|r| r.replicas > 0)
        .cloned()
        .collect();
    ready.sort_by(|a, b| a.image.cmp(&b.image));
    let same = series.last().is_some_and(|p| {
        p.weight == reading.weight
            && p.baseline_weight == reading.baseline_weight
            && p.ready == ready
    });
    if same {
        return;
    }
    if series.len() >= KEPT {
        series.remove(1);
    }
    series.push(SeriesPoint {
        at: Time(now),
        weight: reading.weight,
        baseline_weight: reading.baseline_weight,
        ready,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn ready(pairs: &[(&str, i32)]) -> Vec<ImageReplicas> {
        pairs
            .iter()
            .map(|(i, n)| ImageReplicas {
                image: i.to_string(),
                replicas: *n,
            })
            .collect()
    }

    fn reading(weight: Option<i32>, r: &[ImageReplicas]) -> Reading<'_> {
        Reading {
            weight,
            baseline_weight: None,
            ready: r,
        }
    }

    #[test]
    fn a_point_is_added_only_when_something_changed() {
        let mut series = Vec::new();
        let stable = ready(&[("web:1", 3)]);
        record(&mut series, at(0), reading(None, &stable));
        record(&mut series, at(5), reading(None, &stable));
        assert_eq!(series.len(), 1);
        let canary = ready(&[("web:2", 1), ("web:1", 2)]);
        record(&mut series, at(9), reading(Some(10), &canary));
        record(
            &mut series,
            at(12),
            reading(Some(10), &ready(&[("web:1", 2), ("web:2", 1)])),
        );
        assert_eq!(series.len(), 2, "the order of the images is no change");
        record(&mut series, at(20), reading(Some(50), &canary));
        assert_eq!(series.len(), 3);
        assert_eq!(series[2].at, Time(at(20)));
        assert_eq!(series[2].weight, Some(50));
        assert_eq!(series[1].ready[0].image, "web:1", "sorted by image");
    }

    #[test]
    fn images_with_no_ready_pod_are_left_out() {
        let mut series = Vec::new();
        record(
            &mut series,
            at(0),
            reading(None, &ready(&[("web:1", 3), ("web:2", 0)])),
        );
        assert_eq!(series[0].ready, ready(&[("web:1", 3)]));
        record(&mut series, at(1), reading(None, &ready(&[("web:1", 3)])));
        assert_eq!(series.len(), 1);
    }

    #[test]
    fn the_series_keeps_its_first_point_and_the_newest() {
        let mut series = Vec::new();
        for n in 0..200 {
            record(&mut series, at(n), reading(Some(n as i32), &[]));
        }
        assert_eq!(series.len(), KEPT);
        assert_eq!(series[0].weight, Some(0));
        assert_eq!(series[KEPT - 1].weight, Some(199));
        assert!(series.windows(2).all(|w| w[0].at.0 < w[1].at.0));
    }

    #[test]
    fn a_baseline_share_is_a_change() {
        let mut series = Vec::new();
        record(&mut series, at(0), reading(Some(10), &[]));
        record(
            &mut series,
            at(1),
            Reading {
                weight: Some(10),
                baseline_weight: Some(10),
                ready: &[],
            },
        );
        assert_eq!(series.len(), 2);
    }
}
