//! The rollout API, `rollouts.linnet.dev/v1alpha1`: the `CanaryStatefulSet` and
//! `CanaryDeployment` custom resources and their shared status types. `linnet crds` prints
//! the CustomResourceDefinitions generated from these types.
