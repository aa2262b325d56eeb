//! The desired-state engine: compares what Git wants with what linnet manages in the cluster,
//! and applies the difference with server-side apply. Pruning is opt-in.
