//! Rollout decisions, as pure functions `(spec, observed, now) -> (status, actions)`. Nothing in
//! here does I/O or reads a clock; the controllers execute the actions.
