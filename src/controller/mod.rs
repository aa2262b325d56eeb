//! The kube-runtime controllers for `CanaryStatefulSet` and `CanaryDeployment`: they observe the
//! cluster, ask [`crate::plan`] what to do, execute the actions and record status and events.
