//! Write-back: the only module that writes to Git. It commits rollout status files and posts
//! commit statuses to the Git host, never force-pushes, and never loses a human's commit.
