//! What the kube-proxy section's header and results.json say about the run.

/// What the header names.
pub struct Info {
    pub date: String,
    pub machine: String,
    pub nft: String,
    pub ours: String,
    pub git: String,
    pub upstream: String,
    pub total_secs: f64,
}
