//! The Git source: the only module that reads Git. It keeps a local clone (git2) and learns of
//! new revisions by polling, from Git host webhooks (axum), or from local file changes (notify).
