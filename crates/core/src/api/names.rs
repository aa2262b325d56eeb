//! The names of the API's enums as they leave the process: in status files, `/status`, metric
//! labels, condition reasons, `linnet get` and commit statuses. Each is the enum's serde name
//! (what the API server stores), never Rust's `Debug` text: `PauseMode::Never` is written
//! `None`, and a renamed variant must not rename a label or a reason.

use super::{
    AnalysisPhase, BatchState, DeploymentPhase, DeploymentStrategyType, MeasurementPhase,
    PauseMode, PromotionType, StatefulSetPhase, StatefulSetStrategyType, WebMethod,
};

/// An enum with a name on the wire, for code generic over the two rollout kinds.
pub trait WireName: Copy {
    fn wire_name(self) -> &'static str;
}

macro_rules! wire_names {
    ($($ty:ty { $($variant:ident => $name:literal),+ $(,)? })+) => {
        $(
            impl $ty {
                /// The name on the wire (its serde name).
                pub const fn as_str(self) -> &'static str {
                    match self {
                        $(<$ty>::$variant => $name),+
                    }
                }

                /// Every variant, in declaration order.
                pub const ALL: &'static [$ty] = &[$(<$ty>::$variant),+];
            }

            impl WireName for $ty {
                fn wire_name(self) -> &'static str {
                    self.as_str()
                }
            }

            impl std::fmt::Display for $ty {
                fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str(self.as_str())
                }
            }
        )+

        #[cfg(test)]
        #[test]
        fn every_wire_name_is_the_serde_name() {
            $(
                for v in <$ty>::ALL {
                    assert_eq!(
                        serde_json::to_value(v).ok(),
                        Some(serde_json::Value::String(v.as_str().to_string())),
                        "{}::{v:?}", stringify!($ty)
                    );
                }
            )+
        }
    };
}

wire_names! {
    StatefulSetPhase {
        Initializing => "Initializing",
        Stable => "Stable",
        ScalingDownStable => "ScalingDownStable",
        DeployingCanary => "DeployingCanary",
        CanaryActive => "CanaryActive",
        AwaitingMigration => "AwaitingMigration",
        MigratingData => "MigratingData",
        MigrationFailed => "MigrationFailed",
        Promoting => "Promoting",
        RollingBack => "RollingBack",
        RolledBack => "RolledBack",
        Failed => "Failed",
    }
    DeploymentPhase {
        Initializing => "Initializing",
        Progressing => "Progressing",
        Paused => "Paused",
        Completed => "Completed",
        RollingBack => "RollingBack",
        RolledBack => "RolledBack",
        Failed => "Failed",
    }
    StatefulSetStrategyType {
        TwoSets => "TwoSets",
        Partition => "Partition",
    }
    DeploymentStrategyType {
        Rolling => "Rolling",
        Batches => "Batches",
        BlueGreen => "BlueGreen",
        Rollback => "Rollback",
    }
    PromotionType {
        Auto => "Auto",
        Manual => "Manual",
    }
    PauseMode {
        First => "First",
        All => "All",
        Never => "None",
    }
    BatchState {
        Pending => "Pending",
        InProgress => "InProgress",
        Finished => "Finished",
    }
    AnalysisPhase {
        Running => "Running",
        Successful => "Successful",
        Failed => "Failed",
        Inconclusive => "Inconclusive",
        Error => "Error",
        Stopped => "Stopped",
    }
    MeasurementPhase {
        Successful => "Successful",
        Failed => "Failed",
        Inconclusive => "Inconclusive",
        Error => "Error",
    }
    WebMethod {
        Get => "GET",
        Post => "POST",
    }
}
