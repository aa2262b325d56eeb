//! The status of a rollout no linnet source manages (made with `kubectl apply`): nothing rolls
//! it out, and an empty status reads as healthy to kstatus (Flux's and kpt's health checks),
//! so it gets conditions that say it is stuck, and why.

use jiff::Timestamp;

use super::set_condition;
use crate::api::Condition;

/// Reason of the conditions and the event on a rollout no source manages.
pub const NOT_MANAGED: &str = "NotManaged";

/// The status fields written on an unmanaged rollout of generation `generation`: Stalled
/// (kstatus: Failed), not Ready, not Reconciling, and `message` saying what would manage it.
pub fn not_managed_status(
    generation: Option<i64>,
    message: &str,
    now: Timestamp,
) -> serde_json::Value {
    let mut conditions: Vec<Condition> = Vec::new();
    set_condition(&mut conditions, "Ready", false, NOT_MANAGED, message, now);
    set_condition(&mut conditions, "Stalled", true, NOT_MANAGED, message, now);
    set_condition(&mut conditions, "Reconciling", false, NOT_MANAGED, "", now);
    serde_json::json!({
        "observedGeneration": generation,
        "message": message,
        "conditions": conditions,
    })
}

/// Whether `status` (a rollout's, as JSON) already says NotManaged for `generation`: then
/// nothing is written (after a restart, or by another agent).
pub fn says_not_managed(status: &serde_json::Value, generation: Option<i64>) -> bool {
    status["observedGeneration"].as_i64() == generation
        && status["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Stalled" && c["reason"] == NOT_MANAGED)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_is_written_once_per_generation() {
        let now = Timestamp::from_second(1_800_000_000).unwrap_or_default();
        let written = not_managed_status(Some(2), "no source", now);
        assert!(says_not_managed(&written, Some(2)));
        assert!(
            !says_not_managed(&written, Some(3)),
            "a new generation says it again"
        );
        assert!(!says_not_managed(&serde_json::Value::Null, Some(2)));
        let managed = serde_json::json!({"observedGeneration": 2, "conditions": [
            {"type": "Stalled", "status": "False", "reason": "Stable"}]});
        assert!(!says_not_managed(&managed, Some(2)));
    }

    #[test]
    fn kstatus_reads_an_unmanaged_rollout_as_failed_not_current() {
        // Issue 47: a rollout applied with kubectl had an empty status, which kstatus reads
        // as Current (healthy) although nothing rolls it out.
        let now = Timestamp::from_second(1_800_000_000).unwrap_or_default();
        let object = |status: serde_json::Value| {
            serde_json::json!({
                "apiVersion": crate::api::API_VERSION, "kind": "CanaryStatefulSet",
                "metadata": {"name": "stray", "namespace": "ns", "generation": 1},
                "status": status,
            })
        };
        let cases = vec![
            (
                "no status (before)".to_string(),
                object(serde_json::json!({})),
                "Current",
            ),
            (
                "not managed".to_string(),
                object(not_managed_status(
                    Some(1),
                    "no linnet source manages it",
                    now,
                )),
                "Failed",
            ),
        ];
        super::super::machine::tests::assert_kstatus_reads(&cases);
    }
}
